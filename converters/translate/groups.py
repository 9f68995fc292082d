"""How a grouped binary convolution is written for LCE: the decision, in plain Python.

LCE 0.16's converter makes one grouped `LceBconv2d` from a grouped ±1 filter whose groups each
hold a multiple of 32 input channels, but only two of its three bconv kernels run it: indirect
BGEMM (`use_indirect_bgemm=True`) and the reference kernel. The default kernel, which
`Interpreter(buf)`, `lce_benchmark_model` without flags and an app's default op resolver all
use, refuses it when the interpreter allocates its tensors ("Grouped binary convolutions are
not supported with this kernel", docs/LCE_NOTES.md "Grouped convolutions"). LCE has no binary
depthwise kernel at all. So bnnexport writes every grouped binary conv as one ordinary
`LceBconv2d` per group, which every kernel runs, and `plan_binary_groups` picks:

- ``"single"``: groups == 1: one `LceBconv2d`;
- ``"split"``: at least `MIN_SPLIT_CHANNELS` input channels per group: the float input is split
  along channels, each slice is binarized and convolved on its own (one `LceBconv2d` per group),
  and the accumulators are concatenated. The layer keeps 1-bit weights (a 16-per-group block's
  flatbuffer is 6.5x smaller than its float form); on this host's portable x86 kernels, with
  indirect BGEMM, it runs 1.1-1.4x slower than the same split written with float convs at 16
  per group, and 1.08x (64 per group) to 1.17x (32 per group) slower than LCE's one grouped op
  (docs/BENCHMARKS.md "Grouped latency"), which the default kernel cannot run; below 16
  channels a binary conv still fills a 32-bit word per position, and the split measured about
  3x slower than float at 8 per group and 20x at 1;
- ``"refuse"``: fewer channels per group (depthwise included): the layer stays float, which the
  gate refuses unless `--allow-float`, with `why` as its reason.

Example:
    >>> [plan_binary_groups(64, groups).kind for groups in (1, 2, 4)]
    ['single', 'split', 'split']
    >>> plan_binary_groups(64, 64).kind
    'refuse'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
    if groups == 1:
        return GroupPlan("single", groups)
    if per_group >= MIN_SPLIT_CHANNELS:
        return GroupPlan("split", groups)
    kind = "a depthwise" if per_group == 1 else "a"
    return GroupPlan(
        "refuse",
        groups,
        f"{kind} binary convolution with {groups} groups of {per_group} input channel(s): LCE "
        "0.16 has no binary depthwise kernel, and one LceBconv2d per group (the form LCE's "
        f"default kernels run) is much slower than float below {MIN_SPLIT_CHANNELS} channels "
        f"per group; use at least {MIN_SPLIT_CHANNELS} input channels per group",
    )
