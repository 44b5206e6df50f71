// --seed with sampling as mlx_lm's command lines draw: they seed MLX's global key stream before
// building the model, and the model's random initialization (one key per nn.Linear, nn.Embedding
// and SwitchLinear, weights loaded over it afterwards; one more per module nn.quantize turns into
// its quantized class, whose constructor draws again) moves the stream on before sampling starts.
import { type Gemma4Config, layerSpecs, type LoadedModel } from "@mlx-bun/models";

/**
 * Keys mlx_lm.utils.load takes from the global stream for this checkpoint (mlx_lm/models/
 * gemma4_text.py, nn.quantize), and for `loraLayers` layers of an adapter (--adapter-path: each
 * LoRALinear builds an nn.Linear and draws lora_a).
 */
export function mlxLmLoadDraws(m: Pick<LoadedModel, "config" | "weights">, loraLayers = 0): number {
  let quantized = 0;
  for (const name of m.weights.tensors.keys()) if (name.endsWith(".scales")) quantized++;
  return mlxLmInitDraws(m.config) + quantized + 2 * loraLayers;
}

/** Keys mlx-lm's Gemma 4 constructor takes from the global stream (mlx_lm/models/gemma4_text.py). */
export function mlxLmInitDraws(config: Gemma4Config): number {
  const t = config.text;
  const ple = t.hiddenSizePerLayerInput ? 1 : 0;
  let n = 1; // embed_tokens
  for (const s of layerSpecs(t)) {
    n += 2; // q_proj, o_proj
    if (s.hasKv) n += s.kEqV ? 1 : 2; // k_proj (and v_proj)
    n += 3; // mlp gate, up, down
    if (t.enableMoeBlock) n += 4; // router.proj, switch_glu gate, up, down
    n += 2 * ple; // per_layer_input_gate, per_layer_projection
  }
  n += 2 * ple; // embed_tokens_per_layer, per_layer_model_projection
  if (!t.tieWordEmbeddings) n += 1; // lm_head
  return n;
}
