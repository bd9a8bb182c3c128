"""Run under torchrun by tests/workloads/test_finetune_lora.py: the LoRA consistency check on two real ranks.

The same small fine-tune twice: with DDP (ranks must agree) and with gradients left unsynchronised
(each rank trains on its own shard; the check must fail). Rank 0 writes the outcomes as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from workloads.common import distributed
from workloads.finetune import lora
from workloads.result import WorkloadError


def outcome(cfg: lora.Config) -> dict[str, object]:
    try:
        result = lora.run(cfg)
    except WorkloadError as exc:
        return {"error": str(exc)}
    return {"max_difference": result.details["lora"]["lora_rank_max_difference"],
            "loss_drop": result.metric("lora_loss_drop").value}


def main() -> None:
    with distributed() as here:
        small = lora.Config(steps=8, pretrain_steps=8, train_samples=120, eval_samples=16, warmup_steps=2)
        found = {"synced": outcome(small), "unsynced": outcome(dataclasses.replace(small, sync_gradients=False))}
        if here.rank == 0:
            with open(sys.argv[1], "w") as handle:
                json.dump(found, handle)


if __name__ == "__main__":
    main()
