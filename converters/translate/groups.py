"""How a grouped binary convolution is written for LCE: the decision, in plain Python.

LCE 0.16's converter infers a binary conv's groups from its filter (input channels divided by
the filter's input channels) and makes it one grouped `LceBconv2d` only when every group's
input channels are a multiple of 32, since each group is bit-packed in 32-bit words on its own;
otherwise it leaves a float conv (docs/LCE_NOTES.md "Grouped convolutions"). It has no binary
depthwise kernel. `plan_binary_groups` picks:

- ``"single"``: groups == 1, or a multiple of 32 input channels per group: one `LceBconv2d`;
- ``"split"``: at least `MIN_SPLIT_CHANNELS` input channels per group: the float input is split
  along channels, each slice is binarized and convolved on its own (one ordinary `LceBconv2d`
  per group), and the accumulators are concatenated. The layer keeps 1-bit weights (a 16-per-
  group block's flatbuffer is 6.5x smaller than its float form), and on this host's portable
  x86 kernels it runs 1.1-1.4x slower than the same split written with float convs
  (docs/BENCHMARKS.md "Grouped latency"); below 16 channels a binary conv still fills a 32-bit word
  per position, and the split measured about 3x slower than float at 8 per group and 20x at 1;
- ``"refuse"``: fewer channels per group (depthwise included): the layer stays float, which the
  gate refuses unless `--allow-float`, with `why` as its reason.

Example:
    >>> plan_binary_groups(64, 2).kind, plan_binary_groups(64, 4).kind
    ('single', 'split')
    >>> plan_binary_groups(64, 64).kind
    'refuse'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PACKED_BITS = 32  # LCE packs binary activations in 32-bit words, per group
# below this many input channels per group, one LceBconv2d per group is far slower on the host
# than the same split written with float convs (module doc)
MIN_SPLIT_CHANNELS = 16


@dataclass(frozen=True)
class GroupPlan:
    """One binary conv's grouping: how it is emitted, and why when it cannot be binary."""

    kind: Literal["single", "split", "refuse"]
    groups: int
    why: str = ""


def plan_binary_groups(in_channels: int, groups: int) -> GroupPlan:
    """The plan for a binary conv with `in_channels` inputs in `groups` groups."""
    per_group = in_channels // groups if groups > 0 else 0
    if groups == 1 or (per_group and per_group % PACKED_BITS == 0):
        return GroupPlan("single", groups)
    if per_group >= MIN_SPLIT_CHANNELS:
        return GroupPlan("split", groups)
    kind = "a depthwise" if per_group == 1 else "a"
    return GroupPlan(
        "refuse",
        groups,
        f"{kind} binary convolution with {groups} groups of {per_group} input channel(s): LCE "
        f"0.16 makes a grouped LceBconv2d only from a multiple of {PACKED_BITS} input channels "
        "per group and has no binary depthwise kernel, and one LceBconv2d per group is much slower "
        f"than float below {MIN_SPLIT_CHANNELS} channels per group; use a multiple of "
        f"{PACKED_BITS} (or at least {MIN_SPLIT_CHANNELS}) input channels per group",
    )
