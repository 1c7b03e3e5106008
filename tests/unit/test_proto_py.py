#!/usr/bin/env python3
"""Cross-check of the C proto codec against Python's msgpack (an independent
implementation): messages encoded in C decode in Python to the maps the
schema in proto/messages.h describes, and a map packed in Python (float64
logprobs, an extra unknown key) decodes in C. Usage: test_proto_py.py
<path to proto_emit>."""
import struct
import subprocess
import sys

import msgpack


def main():
    emit = sys.argv[1]
    out = subprocess.run([emit, "encode"], check=True, capture_output=True).stdout
    msgs = []
    while out:
        (n,) = struct.unpack(">I", out[:4])
        msgs.append(msgpack.unpackb(out[4:4 + n], raw=False, strict_map_key=True))
        out = out[4 + n:]
    assert len(msgs) == 2, msgs

    expected_prefill = {
        "type": "prefill_request", "v": 1,
        "request_id": bytes(range(16)),
        "decode_worker_id": "decode-0", "decode_epoch": 5,
        "token_ids": [1, 2, 999],
        "sampling": {
            "temperature": 0.5, "top_p": 0.75, "top_k": 40, "min_p": 0.0,
            "repetition_penalty": 1.0, "presence_penalty": -0.5,
            "frequency_penalty": 0.25, "seed": 2**64 - 1, "max_tokens": 16,
            "stop_token_ids": [2], "logprobs": True, "top_logprobs": 2,
            "ignore_eos": False,
        },
        "tenant": "acme", "cache_salt": 0, "deadline_unix_us": 1700000000000000,
    }
    assert msgs[0] == expected_prefill, msgs[0]
    expected_event = {
        "type": "kv_event", "v": 1, "worker_id": "prefill-1", "epoch": 2, "seq": 300,
        "full": False, "full_part": 0, "full_last": False,
        "stored": [{"h": b"\x11" * 16, "p": b"\x00" * 16, "n": 16}],
        "removed": [b"\xab" * 16],
    }
    assert msgs[1] == expected_event, msgs[1]

    chunk = {
        "v": 1, "type": "token_chunk", "worker_id": "decode-0", "step_id": 12,
        "x_added_in_v1_7": {"anything": [1, 2.5]},
        "entries": [
            {"request_id": bytes([7] * 16), "token_ids": [5, 6],
             "logprobs": [-0.5, -1.25], "finish_reason": "none"},
            {"request_id": bytes([8] * 16), "token_ids": [2], "finish_reason": "stop"},
        ],
    }
    packed = msgpack.packb(chunk, use_bin_type=True)
    r = subprocess.run([emit, "decode"], input=packed, capture_output=True)
    line = r.stdout.decode().strip()
    want = ("token_chunk decode-0 step=12 entries=2 [rid0=7 tokens=5,6 lp=-0.5,-1.25 finish=0]"
            " [rid0=8 tokens=2 lp= finish=1]")
    assert r.returncode == 0 and line == want, (r.returncode, line)

    # A token id at the vocabulary size is refused (BATON_ERR_OUT_OF_RANGE = -6).
    chunk["entries"][1]["token_ids"] = [1000]
    r = subprocess.run([emit, "decode"], input=msgpack.packb(chunk, use_bin_type=True),
                       capture_output=True)
    assert r.returncode == 1 and r.stdout.decode().strip() == "error -6", r.stdout
    # str instead of bin for the request id: format error (-4).
    chunk["entries"][1]["token_ids"] = [1]
    chunk["entries"][1]["request_id"] = "x" * 16
    r = subprocess.run([emit, "decode"], input=msgpack.packb(chunk, use_bin_type=True),
                       capture_output=True)
    assert r.returncode == 1 and r.stdout.decode().strip() == "error -4", r.stdout
    print("python cross-check passed")


if __name__ == "__main__":
    main()
