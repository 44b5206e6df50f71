"""Which rounding points of MLX's composed decode attention must a fused kernel keep for KL <= 1e-4?

Runs mlx-lm's Gemma 4 (cast to bf16) with its one-token attention replaced by float32 attention that
rounds the scores ("s"), the probabilities ("p"), both ("sp") or neither ("f32") to the model's dtype,
and prints the teacher-forced KL per token against mlx-lm's own attention (docs/custom-kernels.md,
"Decode attention at MLX's rounding points"):
  .native/venv/bin/python tools/bench/attention-rounding-kl.py .native/bench-models/gemma4-mini-4bit 16 f32,s,p,sp
"""
import sys, math, mlx.core as mx, mlx_lm
from mlx_lm.models import gemma4_text as g
from mlx_lm.models.cache import make_prompt_cache
orig = g.scaled_dot_product_attention
MODE = "ref"
def bf(x, dt): return x.astype(dt).astype(mx.float32)
def variant(q, k, v, cache, scale, mask, sinks=None):
    # One decode token without a mask (the kernels' domain); everything else as mlx-lm runs it.
    if MODE == "ref" or q.shape[2] != 1 or mask is not None or sinks is not None or hasattr(cache, "bits"):
        return orig(q, k, v, cache, scale=scale, mask=mask, sinks=sinks)
    dt = q.dtype
    B, Hq, L, D = q.shape; Hk = k.shape[1]; r = Hq // Hk
    qf = (q * scale).astype(mx.float32).reshape(B, Hk, r, L, D)
    kf = k.astype(mx.float32)[:, :, None]; vf = v.astype(mx.float32)[:, :, None]
    s = qf @ kf.swapaxes(-1, -2)
    if "s" in MODE: s = bf(s, dt)
    mx_ = s.max(-1, keepdims=True); e = mx.exp(s - mx_); l = e.sum(-1, keepdims=True); p = e / l
    if "p" in MODE: p = bf(p, dt)
    o = p @ vf
    return o.reshape(B, Hq, L, -1).astype(dt)
g.scaled_dot_product_attention = variant
model, tok = mlx_lm.load(sys.argv[1]); model.set_dtype(mx.bfloat16)
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 16
mx.random.seed(0)
prompt = mx.random.randint(10, 1000, (65,)).tolist()
def run(tokens=None):
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[:, -1]
    out, lps = [], []
    for i in range(steps):
        lp = logits.astype(mx.float32); lp = lp - mx.logsumexp(lp, -1, keepdims=True)
        lps.append(lp); t = tokens[i] if tokens else int(lp.argmax().item()); out.append(t)
        logits = model(mx.array([[t]]), cache=cache)[:, -1]
        mx.eval(logits)
    return out, lps
ref_toks, ref_lps = run()
for mode in sys.argv[3].split(","):
    MODE = mode
    toks, lps = run(ref_toks)
    kls = [float((mx.exp(a) * (a - b)).sum().item()) for a, b in zip(ref_lps, lps)]
    same = sum(int(a.argmax().item() == b.argmax().item()) for a, b in zip(ref_lps, lps))
    kls.sort()
    print(f"{mode:6s} KL max {kls[-1]:.2e} median {kls[len(kls)//2]:.2e} greedy {same}/{steps}", flush=True)
