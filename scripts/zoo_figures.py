"""Store the model zoo's figures with the package: bnnexport/models/zoo_figures.json.

`bnnexport zoo list` prints each model's parameters, binary shares and binary layers from that
file while the code they were computed from is unchanged (`bnnexport.stages.zoo.fingerprint`), and
summarises a changed model afresh. Run this after changing a model, its layers, the discovery
or the summary (tests/models/test_zoo.py says so when the file is stale); it builds and traces
every model at its native size: a minute or two.

    python scripts/zoo_figures.py
"""

from __future__ import annotations

import sys
import time

from bnnexport.stages.zoo import FIGURES, write_figures


def main() -> None:
    start = time.perf_counter()
    write_figures(FIGURES, progress=lambda name: print(f"summarising {name}", file=sys.stderr))
    print(f"wrote {FIGURES} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
