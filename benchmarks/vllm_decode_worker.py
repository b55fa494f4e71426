"""vLLM side of benchmarks/bench_decode.py, run in the vLLM environment.

    python benchmarks/vllm_decode_worker.py spec.json

spec: {"model": dir, "batches": {"8": [[ids...], ...], ...}, "new": 32, "repeats": 2}.
Prints one JSON line: startup seconds (engine construction + first call),
weight-sync seconds (`VLLMEngine.update_weights` of the model's own weights)
and per batch the best (wall, cpu) seconds of a 1-token call ("prefill") and a
``new``-token call ("e2e"), greedy, stop tokens off. Prefix caching is reset
before every call, so each call prefills its prompts (within a call the shared
system message is computed once, as in the other engines).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    import torch

    from evoharness.engines.grammar import GenRequest
    from evoharness.engines.vllm_engine import VLLMEngine
    from evoharness.models.init import load_model

    torch.set_num_threads(1)
    t = time.perf_counter()
    eng = VLLMEngine(
        spec["model"],
        stop_ids=[],
        max_model_len=1024,
        max_num_seqs=max(map(int, spec["batches"])),
        max_num_batched_tokens=32768,
    )
    eng.generate([GenRequest([1, 2, 3])], 2)
    startup = time.perf_counter() - t
    sd = load_model(spec["model"]).state_dict()
    t = time.perf_counter()
    eng.update_weights(sd)
    sync = time.perf_counter() - t
    out = {"startup_s": startup, "sync_s": sync, "batches": {}}
    for b, prompts in spec["batches"].items():
        reqs = [GenRequest(p) for p in prompts]
        best = {}
        for _ in range(spec["repeats"]):
            for key, new in (("prefill", 1), ("e2e", spec["new"])):
                eng.llm.reset_prefix_cache()
                w, c = time.perf_counter(), time.process_time()
                res = eng.generate(reqs, new)
                w, c = time.perf_counter() - w, time.process_time() - c
                assert all(len(r.token_ids) == new for r in res)
                old = best.get(key, (9e9, 9e9))
                best[key] = (min(old[0], w), min(old[1], c))
        out["batches"][b] = best
    print(json.dumps(out))


if __name__ == "__main__":
    main()
