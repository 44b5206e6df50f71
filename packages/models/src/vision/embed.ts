// Image soft tokens in the prompt, as mlx-vlm 0.7.10 places them (gemma4/processing_gemma4.py,
// gemma4.py get_input_embeddings, language.py _make_masks): each image token of the rendered
// prompt becomes <boi> + n image tokens + <eoi>; the scaled token embeddings get the soft tokens
// at the image positions (masked_scatter, in order); the per-layer embeddings read token 0 there;
// with text_config.use_bidirectional_attention == "vision" a whole-prompt prefill lets the tokens
// of one image attend to each other (causal mask | same image block).
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { Mask } from "@mlx-bun/kv-cache";
import type { LayerType } from "../config.ts";
import { WeightsError } from "../errors.ts";
import type { ForwardInputs, Gemma4Model } from "../model/gemma4.ts";
import type { MultimodalTokens } from "./encoder.ts";

/** Replace the i-th image token of `ids` by <boi> + softTokens[i] image tokens + <eoi> (processing_gemma4.py). */
export function expandImageTokens(ids: readonly number[], softTokens: readonly number[], t: MultimodalTokens): number[] {
  const out: number[] = [];
  let i = 0;
  for (const id of ids) {
    if (id !== t.imageTokenId) {
      out.push(id);
      continue;
    }
    const n = softTokens[i++];
    if (n === undefined) throw new WeightsError(`the prompt has more image tokens than images (${softTokens.length})`);
    out.push(t.boiTokenId);
    for (let k = 0; k < n; k++) out.push(t.imageTokenId);
    out.push(t.eoiTokenId);
  }
  if (i !== softTokens.length) throw new WeightsError(`${softTokens.length} images but ${i} image tokens in the prompt`);
  return out;
}

/**
 * Whether the model attends bidirectionally within an image (text_config.use_bidirectional_attention
 * == "vision"; where the key is absent, gemma4_unified's TextConfig default is "vision").
 */
export function bidirectionalVision(model: Gemma4Model): boolean {
  const tc = model.config.raw.text_config;
  const v = typeof tc === "object" && tc !== null ? (tc as Record<string, unknown>).use_bidirectional_attention : model.config.raw.use_bidirectional_attention;
  return v === "vision" || (v === undefined && model.config.modelType === "gemma4_unified");
}

/** Forward inputs that own their arrays. */
export interface OwnedForwardInputs extends Disposable {
  inputs: ForwardInputs;
  dispose(): void;
}

/**
 * The forward inputs of a prompt `ids` (image tokens already expanded) with the soft tokens of its
 * images in order (`features`, each [n_i, hidden]). `offset` is the cache offset this chunk starts
 * at: the bidirectional overlay applies only to a prefill from an empty cache, as in mlx-vlm
 * (its overlay needs a square mask).
 */
export function multimodalInputs(
  model: Gemma4Model,
  t: MultimodalTokens,
  ids: readonly number[],
  features: readonly MlxArray[],
  offset = 0,
): OwnedForwardInputs {
  const L = ids.length;
  const hidden = model.config.text.hiddenSize;
  const media = new Set([t.imageTokenId, t.audioTokenId, t.videoTokenId].filter((x): x is number => x !== null));
  const owned: MlxArray[] = [];
  const own = (a: MlxArray): MlxArray => {
    owned.push(a);
    return a;
  };
  try {
    const idsArr = own(MlxArray.fromTypedArray(Int32Array.from(ids), [1, L], "int32"));
    const h0 = own(model.embedScaled(idsArr));
    const nImage = ids.reduce((n, id) => n + (id === t.imageTokenId ? 1 : 0), 0);
    const nFeat = features.reduce((n, f) => n + f.shape[0]!, 0);
    if (nImage !== nFeat) throw new WeightsError(`the prompt has ${nImage} image tokens but the images give ${nFeat} soft tokens`);
    let h = h0;
    if (nImage > 0) {
      const f = own(features.length === 1 ? mx.astype(features[0]!, h0.dtype) : mx.astype(own(mx.concatenate([...features], 0)), h0.dtype));
      const flat = own(mx.reshape(h0, [L, hidden]));
      const both = own(mx.concatenate([flat, f], 0));
      const idx = new Int32Array(L);
      let j = 0;
      for (let i = 0; i < L; i++) idx[i] = ids[i] === t.imageTokenId ? L + j++ : i;
      const ia = own(MlxArray.fromTypedArray(idx, [L], "int32"));
      const g = own(mx.take(both, ia, 0));
      h = own(mx.reshape(g, [1, L, hidden]));
    }
    const ple = Int32Array.from(ids, (id) => (media.has(id) ? 0 : id));
    const pleIds = own(MlxArray.fromTypedArray(ple, [1, L], "int32"));
    const inputs: ForwardInputs = { embedded: { h, pleIds } };
    if (nImage > 0 && L > 1 && offset === 0 && bidirectionalVision(model)) {
      // block id per position: consecutive image tokens form one block (_block_sequence_ids_for_mask).
      const block = new Int32Array(L).fill(-1);
      let b = -1;
      for (let i = 0; i < L; i++) {
        if (ids[i] === t.imageTokenId) {
          if (i === 0 || ids[i - 1] !== t.imageTokenId) b++;
          block[i] = b;
        }
      }
      const masks = new Map<LayerType, Mask>();
      for (const spec of model.specs) {
        if (masks.has(spec.type)) continue;
        const w = spec.window;
        const m = new Uint8Array(L * L);
        for (let q = 0; q < L; q++) {
          for (let k = 0; k < L; k++) {
            const causal = k <= q && (w === null || q < k + w);
            m[q * L + k] = causal || (block[q]! >= 0 && block[q] === block[k]) ? 1 : 0;
          }
        }
        masks.set(spec.type, own(MlxArray.fromTypedArray(m, [1, 1, L, L], "bool")));
      }
      inputs.masks = masks;
    }
    const dispose = (): void => {
      for (const a of owned) a.dispose();
      owned.length = 0;
    };
    return { inputs, dispose, [Symbol.dispose]: dispose };
  } catch (e) {
    for (const a of owned) a.dispose();
    throw e;
  }
}
