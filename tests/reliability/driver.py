"""Training driver run as a subprocess by the crash tests: one ``rlvr_core.training.train`` call.

    python tests/reliability/driver.py POLICY_DIR RUN_DIR CONFIG_JSON

CONFIG_JSON holds the ``train`` section; the data is always
``make_arithmetic(400, 60, 0, digits=(1, 2, 3))``. ``$RLVR_FAULT_KILL_AT`` makes
it SIGKILL itself at a chosen point (``rlvr_core.checkpoint.fault_point``).
Prints ``STEP <n>`` after every step (the parent may kill it on such a line)
and ``DONE <steps> <resumed_from>`` at the end.
"""

from __future__ import annotations

import json
import sys

from rlvr_core.config import TrainConfig
from rlvr_core.training import check_and_train
from tests.reliability.common import dataset


def main() -> None:
    policy, run_dir, cfg_json = sys.argv[1:4]
    ds = dataset()

    def on_step(rec: dict) -> None:
        print(f"STEP {rec['step']}", flush=True)

    res = check_and_train(TrainConfig(**json.loads(cfg_json)), policy_dir=policy, train_rows=ds["train"],
                          test_rows=ds["test"], run_dir=run_dir, on_step=on_step)
    print(f"DONE {res.steps_done} {res.resumed_from}", flush=True)


if __name__ == "__main__":
    main()
