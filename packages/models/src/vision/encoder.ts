// What the two Gemma 4 image encoders share: the multimodal token ids, the encoder contract, the ownership of their weights,
// and embed_vision (mlx-vlm's MultimodalEmbedder), the last step of both.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { linear, type ModuleWeights } from "../model/nn.ts";
import type { Scope } from "../model/scope.ts";
import type { PreprocessedImage } from "./preprocess.ts";

/** The multimodal token ids of the wrapper config (mlx-vlm ModelConfig defaults). */
export interface MultimodalTokens {
  imageTokenId: number;
  boiTokenId: number;
  eoiTokenId: number;
  audioTokenId: number | null;
  videoTokenId: number | null;
}

/** An image encoder: the gemma4 vision tower or gemma4_unified's vision embedder. */
export interface VisionEncoder extends Disposable {
  readonly tokens: MultimodalTokens;
  /** One image's soft tokens [n, text hidden] (n = img.softTokens); the caller owns the result. */
  encode(img: PreprocessedImage): MlxArray;
  dispose(): void;
}

/** The tensors an encoder was loaded with and the arrays it derived from them, all owned by it. */
export abstract class EncoderWeights implements Disposable {
  #tensors: Map<string, MlxArray>;
  #owned: MlxArray[] = [];

  protected constructor(tensors: Map<string, MlxArray>) {
    this.#tensors = tensors;
  }

  /** Keep `a` (derived from the weights) until dispose. */
  protected own(a: MlxArray): MlxArray {
    this.#owned.push(a);
    return a;
  }

  dispose(): void {
    for (const a of this.#owned) a.dispose();
    this.#owned = [];
    for (const a of this.#tensors.values()) a.dispose();
    this.#tensors.clear();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** embed_vision (MultimodalEmbedder): RMSNorm without scale, then the projection to the text width. */
export function embedVision(s: Scope, x: MlxArray, projection: ModuleWeights, eps: number): MlxArray {
  const n = s.t(mx.fast.rms_norm(x, null, eps));
  return s.t(linear(projection, n));
}
