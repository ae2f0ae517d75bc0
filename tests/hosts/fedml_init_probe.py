"""Calls the real ``fedml.init()`` with changed arguments and writes what each call did (test only).

``python fedml_init_probe.py JOBS.json``, JOBS a list of jobs, each ``{"cf": yaml, "cwd": folder,
"argv": [more command-line words], "cases": {name: {arg: value}}, "result": json path}``.

``import fedml`` (seconds of CPU) runs once, here. Each job runs in a child forked before any
``fedml.init()``, so each starts from what a fresh ``python`` process would: what one job's init
leaves behind (``fedml._global_training_type``, the environment version, FedML's logging, the
stdout FedML rewrites) never reaches the next job. Within a job the cases run in order in the
one child, each from ``load_arguments`` on the job's command line with its arguments changed;
each records ``ran`` or the ValueError's message, and ``torch.initial_seed()`` after the call.
A job whose child fails otherwise writes no result.
"""

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import fedml
import torch
from fedml.arguments import load_arguments


def run(job: dict[str, Any]) -> None:
    os.chdir(job["cwd"])
    argv = [sys.argv[0], "--cf", job["cf"], *job["argv"]]
    out: dict[str, Any] = {}
    for case, change in job["cases"].items():
        sys.argv = list(argv)
        args = load_arguments(fedml._global_training_type, fedml._global_comm_backend)
        for key, value in change.items():
            setattr(args, key, value)
        try:
            fedml.init(args)
            out[case] = "ran"
        except ValueError as e:
            out[case] = str(e)
        out[f"{case} seed"] = torch.initial_seed()
    Path(job["result"]).write_text(json.dumps(out))  # FedML rewrites stdout


for job in json.loads(Path(sys.argv[1]).read_text()):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            run(job)
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.waitpid(pid, 0)
