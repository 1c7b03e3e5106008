"""NumPy reference of the llama / qwen2 forward as llama.cpp defines it for a
GGUF file (float64 throughout).

Independent of baton's C code: weights are read and dequantized by the `gguf`
package (GGUFReader, gguf.quants.dequantize), and the forward follows
llama.cpp's graph (src/llama-model.cpp, llm_build_llama / llm_build_qwen2):

    x = token_embd[tokens]
    per layer:
        h = rmsnorm(x) * attn_norm
        q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)
        rope(q), rope(k)        llama: ggml "normal" mode, pairs (2i, 2i+1)
                                qwen2: NeoX mode, pairs (i, i + d/2)
                                theta_i = pos * freq_scale * base^(-2i/d) / freq_factor_i
        attn = softmax(q k^T / sqrt(d) + causal mask) v    (GQA: head h uses kv head h // (H/Hkv))
        x += attn Wo^T
        h = rmsnorm(x) * ffn_norm
        x += (silu(h Wg^T) * (h Wu^T)) Wd^T
    logits = (rmsnorm(x) * output_norm) Wout^T   (Wout = token_embd when output.weight is absent)

Usage as a library: `ReferenceModel(path).forward(tokens) -> [n, n_vocab]`.
"""
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


class ReferenceModel:
    def __init__(self, path):
        r = GGUFReader(path)
        self.arch = _field(r, "general.architecture")
        a = self.arch
        self.n_layer = int(_field(r, f"{a}.block_count"))
        self.n_embd = int(_field(r, f"{a}.embedding_length"))
        self.n_head = int(_field(r, f"{a}.attention.head_count"))
        self.n_head_kv = int(_field(r, f"{a}.attention.head_count_kv", self.n_head))
        self.eps = float(_field(r, f"{a}.attention.layer_norm_rms_epsilon"))
        self.freq_base = float(_field(r, f"{a}.rope.freq_base", 10000.0))
        scaling_type = _field(r, f"{a}.rope.scaling.type", "none")
        factor = float(_field(r, f"{a}.rope.scaling.factor", 0.0) or 0.0)
        self.freq_scale = 1.0 / factor if scaling_type == "linear" and factor > 0 else 1.0
        self.head_dim = self.n_embd // self.n_head
        self.neox = a == "qwen2"
        self.w = {}
        for t in r.tensors:
            arr = dequantize(np.array(t.data), t.tensor_type).astype(np.float64)
            shape = [int(x) for x in reversed(list(t.shape))]  # ne reversed: [rows, cols]
            self.w[t.name] = arr.reshape(shape)
        self.freq_factors = self.w.get("rope_freqs.weight")
        self.out_w = self.w.get("output.weight", self.w["token_embd.weight"])

    def _rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos):
        # x [n, heads, d]
        d = self.head_dim
        i = np.arange(d // 2)
        theta = self.freq_scale * self.freq_base ** (-2.0 * i / d)
        if self.freq_factors is not None:
            theta = theta / self.freq_factors.reshape(-1)
        ang = pos[:, None] * theta[None, :]  # [n, d/2]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        y = x.copy()
        if self.neox:
            x0, x1 = x[..., : d // 2], x[..., d // 2 :]
            y[..., : d // 2] = x0 * c - x1 * s
            y[..., d // 2 :] = x0 * s + x1 * c
        else:
            x0, x1 = x[..., 0::2], x[..., 1::2]
            y[..., 0::2] = x0 * c - x1 * s
            y[..., 1::2] = x0 * s + x1 * c
        return y

    def forward(self, tokens):
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        H, Hkv, d = self.n_head, self.n_head_kv, self.head_dim
        pos = np.arange(n, dtype=np.float64)
        x = self.w["token_embd.weight"][tokens]
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for l in range(self.n_layer):
            p = f"blk.{l}."
            h = self._rms(x, self.w[p + "attn_norm.weight"])
            q = h @ self.w[p + "attn_q.weight"].T
            k = h @ self.w[p + "attn_k.weight"].T
            v = h @ self.w[p + "attn_v.weight"].T
            if p + "attn_q.bias" in self.w:
                q = q + self.w[p + "attn_q.bias"].reshape(-1)
                k = k + self.w[p + "attn_k.bias"].reshape(-1)
                v = v + self.w[p + "attn_v.bias"].reshape(-1)
            q = self._rope(q.reshape(n, H, d), pos)
            k = self._rope(k.reshape(n, Hkv, d), pos)
            v = v.reshape(n, Hkv, d)
            out = np.zeros((n, H, d))
            for hh in range(H):
                kh = hh // (H // Hkv)
                s = q[:, hh, :] @ k[:, kh, :].T / np.sqrt(d) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                out[:, hh, :] = s @ v[:, kh, :]
            x = x + out.reshape(n, H * d) @ self.w[p + "attn_output.weight"].T
            h = self._rms(x, self.w[p + "ffn_norm.weight"])
            g = h @ self.w[p + "ffn_gate.weight"].T
            u = h @ self.w[p + "ffn_up.weight"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ self.w[p + "ffn_down.weight"].T
        x = self._rms(x, self.w["output_norm.weight"])
        return x @ self.out_w.T
