"""Dev check of the Triton kernels on the CPU (TRITON_INTERPRET=1): kernel vs emulator vs exact."""
import os, sys, time
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch
from fsattn_diffusers.recipe import PRESETS
from fsattn_diffusers.emulator import emulate_attention
from fsattn_diffusers.kernels.plan import plan_for
from fsattn_diffusers.kernels.ops import fused_attention

def exact(q, k, v, scale, kv_lens=None):
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    if kv_lens is not None:
        pos = torch.arange(k.shape[2])
        s = s.masked_fill(~(pos[None, :] < kv_lens[:, None])[:, None, None, :], float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1), v.double())

def err(a, r):
    a, r = a.double(), r.double()
    return ((a - r).norm() / r.norm()).item(), torch.nn.functional.cosine_similarity(a.flatten(), r.flatten(), dim=0).item()

torch.manual_seed(0)
cases = [(1, 2, 200, 300, 64), (2, 1, 130, 129, 128)]
for name in sys.argv[1:] or ["mxfp8"]:
    for (b, h, sq, sk, d) in cases:
        q, k, v = (torch.randn(b, h, s, d) for s in (sq, sk, sk))
        kvl = torch.tensor([sk, sk // 2 + 3][:b])
        scale = d ** -0.5
        t0 = time.time()
        out, lse, st = fused_attention(q, k, v, plan_for(PRESETS[name]), scale=scale, kv_lens=kvl, return_lse=True, return_stats=True)
        ref = exact(q, k, v, scale, kvl)
        emu, else_, est = emulate_attention(q, k, v, PRESETS[name], scale=scale, kv_lens=kvl, return_lse=True, return_stats=True)
        print(name, (b, h, sq, sk, d), "kernel", err(out, ref), "emu", err(emu, ref), "k-vs-emu", err(out, emu),
              "lse maxdiff", (lse - else_).abs().max().item(), st, f"{time.time()-t0:.1f}s")
