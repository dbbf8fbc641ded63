"""Which experts this rank decodes under expert parallelism (serving/ownership.py).

The layer here is a minimal stand-in with the two things ownership asks of sglang's FusedMoE
(its global -> local expert map and ``moe_ep_size``), so the rule itself runs with no sglang
import. The real FusedMoE at EP=2, through sglang's loader in two gloo ranks, is
``test/integration/test_tensor_parallel.py``.
"""

from __future__ import annotations

import torch

from sglang_mtp_dequant.serving.ownership import ExpertOwnership


class StandInMoE(torch.nn.Module):
    """What ownership reads of a FusedMoE: experts kept are ``rank::ep`` (sglang's contiguous
    placement is not assumed by the rule; the map is asked per expert)."""

    def __init__(self, num_experts: int, ep_size: int, rank: int) -> None:
        super().__init__()
        self.num_experts, self.moe_ep_size, self.rank = num_experts, ep_size, rank
        self.w13_weight = torch.nn.Parameter(torch.zeros(num_experts // ep_size, 2, 2))

    def _map_global_expert_id_to_local_expert_id(self, expert: int) -> int:
        return expert // self.moe_ep_size if expert % self.moe_ep_size == self.rank else -1


class Draft(torch.nn.Module):
    def __init__(self, moe: torch.nn.Module) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.model.layers[0].mlp = torch.nn.Module()
        self.model.layers[0].mlp.experts = moe


EXPERT = "mtp.layers.0.mlp.experts.{}.up_proj.weight"


def test_each_rank_keeps_only_the_experts_its_layer_maps():
    for rank in (0, 1):
        owned = ExpertOwnership.of(Draft(StandInMoE(8, 2, rank)))
        assert owned is not None
        assert [e for e in range(8) if owned.keeps(EXPERT.format(e))] == list(range(rank, 8, 2))
        assert owned.kept_experts("mtp.layers.0.mlp.experts.gate_up_proj", 8) == list(
            range(rank, 8, 2)
        )


def test_names_that_are_no_expert_are_always_kept():
    owned = ExpertOwnership.of(Draft(StandInMoE(8, 2, 1)))
    assert owned.keeps("mtp.layers.0.mlp.shared_expert.up_proj.weight")
    assert owned.keeps("mtp.layers.0.self_attn.q_proj.weight")


def test_one_rank_or_no_moe_layer_means_no_filtering():
    assert ExpertOwnership.of(Draft(StandInMoE(8, 1, 0))) is None
    assert ExpertOwnership.of(torch.nn.Linear(2, 2)) is None


def test_a_layer_holding_every_expert_keeps_all():
    moe = StandInMoE(8, 2, 1)
    moe.w13_weight._sglang_require_global_experts = True
    assert ExpertOwnership.of(Draft(moe)) is None
