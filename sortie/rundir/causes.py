"""Why a job failed, read from the last lines of its first failed node's log: the line that
says it (no torch, a known cause and its advice, an abort, the exception a rank raised), said
with the run's error line, so that a user reads the cause before opening any log."""

from __future__ import annotations

import re

from sortie.bootstrap.workdir import module_home
from sortie.trainer.torchrun import NO_TORCH, PORT_TAKEN

# A process that aborted, as its log says it: std::terminate's own line first, else the signal.
ABORT_LINES = (re.compile(r"terminate called"), re.compile(r"SIGABRT|\bSignal 6\b"))
# argparse's refusal of a script written for `torch.distributed.launch`, which passed the flag.
LOCAL_RANK_FLAG = re.compile(r"error: (the following arguments are required|unrecognized "
                             r"arguments): .*--local[-_]rank")
# argparse's refusal of the arguments the script was given (after its `usage:` line): a
# required flag missing, a value of the wrong type.
ARGUMENTS_REFUSED = re.compile(r"^\s*(?:\[rank\d{1,6}\]:\s*)?([\w.\-]{1,100}): error: "
                               r"([\x20-\x7e]{1,2000})$")
USAGE = re.compile(r"^\s*(?:\[rank\d{1,6}\]:\s*)?usage: ")
# torch's refusals of CUDA or NCCL where the node or its torch has none: a GPU script's first
# run on local nodes, or a setup that installed a CPU build of torch.
NEEDS_CUDA = re.compile(r"doesn't have NCCL built in|ProcessGroupNCCL is only supported with "
                        r"GPUs|Torch not compiled with CUDA enabled|Found no NVIDIA driver|"
                        r"No CUDA GPUs are available")
# A distributed script started without torchrun (a `run` line's `python train.py`): the variables
# torchrun sets in each process are not there.
NO_RANK = re.compile(r"environment variable (RANK|WORLD_SIZE|LOCAL_RANK) expected, but not set|"
                     r"KeyError: '(RANK|LOCAL_RANK|WORLD_SIZE)'")
# A module the job's Python lacks (torch's own absence is `NO_TORCH`'s): a name, bounded.
NO_MODULE = re.compile(r"ModuleNotFoundError: No module named "
                       r"'(?!torch['.])([A-Za-z0-9_.]{1,100})'")
# A file the job opened that its node lacks: a path of the user's machine (absolute), or one
# of the workdir the sync left out (relative; often data a .gitignore names). Bounded, printable.
NO_FILE = (r"FileNotFoundError: \[Errno 2\] No such file or directory: "
           r"'(%s[\x20-\x26\x28-\x7e]{1,200})'")
NO_FILE_ABSOLUTE, NO_FILE_RELATIVE = re.compile(NO_FILE % "(?=/)"), re.compile(NO_FILE % "(?!/)")
# A process killed by SIGKILL, as torchrun (and its wrapper) say it: sortie's own stops are
# said of the nodes it stopped, so here most often the kernel's out-of-memory killer.
KILLED = re.compile(r"exitcode: -9\)|\(exit -9\)|Signal 9 \(SIGKILL\)")
PORT_TAKEN_LINE = re.compile(re.escape(PORT_TAKEN) + r"(\S{1,300})")
# What a failure's log line shows, said with the failure: what is wrong and what to change
# (``\1``: what the pattern found).
KNOWN_CAUSES = (
    (LOCAL_RANK_FLAG, "the script takes a --local_rank flag, which torchrun does not pass "
     "(torch.distributed.launch did): it sets LOCAL_RANK in each process's environment; read "
     "that (or give the flag a default)"),
    (NEEDS_CUDA, "the job asks for CUDA or NCCL, which the node or its torch lacks (local and "
     "booted nodes have no GPUs; a CPU build of torch has no NCCL): where "
     "torch.cuda.is_available() is False, use gloo and the CPU (`dist.init_process_group("
     "\"nccl\" if torch.cuda.is_available() else \"gloo\")`)"),
    (NO_MODULE, "the job's Python has no module '\\1': install what provides it in the job's "
     "setup (`--setup 'pip install -r requirements.txt'`, or `setup:` in a task file; your own "
     "package in the workdir: `pip install -e .`), which runs on every node in the job's own "
     "environment (or its image) before the job"),
    (NO_RANK, "the job's processes have no \\1\\2, which torchrun sets in each process it "
     "starts, and a `run` line's command is not started by it: `--script train.py` runs the "
     "script under torchrun on every node, or the run line starts torchrun itself "
     "(`$SORTIE_TORCHRUN --nnodes=$SORTIE_NUM_NODES --nproc-per-node=$SORTIE_PROCS_PER_NODE "
     "... train.py`, docs/your-job.md)"),
    (PORT_TAKEN_LINE, "the rendezvous port \\1 was taken by another program on the head node "
     "after sortie chose it free: a new cluster chooses another (a held cluster keeps its "
     "own until `sortie down`; attached hosts: another `rdzv_port` in the hosts file)"),
    (KILLED, "a process of the job was killed (SIGKILL), most often by the kernel when the node "
     "ran out of memory (its kernel log, `dmesg`, says so): fewer processes a node or less "
     "memory each"),
    (NO_FILE_ABSOLUTE, "the job opened '\\1', which the node does not have: only the workdir goes "
     "to the nodes (the job runs in its copy there), so a path of your machine is not on them; "
     "data goes in the workdir, opened by a relative path, or where every node reads it (the "
     "bucket, a shared file system)"),
    (NO_FILE_RELATIVE, "the job opened '\\1', which the node's copy of the workdir does not "
     "have: a file the workdir's .gitignore names is not synced (the sync's line says which "
     "rules chose the files; a .sortieignore replaces them), and one the job makes must be "
     "made before it is read"),
)
# The exception a rank raised, as Python (and torchrun's `[rankN]:` prefix) prints its last
# line; not the ones that only follow from another rank's end (gloo's closed connection,
# torchrun's ChildFailedError).
RAISED = re.compile(r"^\s*(?:\[rank(\d{1,6})\]:\s*)?((?:[A-Za-z_]\w{0,60}\.){0,8}"
                    r"[A-Za-z_]\w{0,60}(?:Error|Exception)): (\S.{0,199})")
CONSEQUENCE = re.compile(r"ChildFailedError|remote worker crashing|Connection (closed|reset) "
                         r"by peer")
# A traceback's frame (or a SyntaxError's place), as Python prints it: the file and line.
FRAME = re.compile(r'^\s*(?:\[rank(\d{1,6})\]:\s*)?File "([^"]{1,500})", line (\d{1,7})')


def failure_cause(tail: list[str], where: str = "", last_step_line: str | None = None,
                  workdir_files: tuple[str, ...] = ()) -> str:
    """": on node-1, rank 3 raised ValueError: bad shape" (``where``: " on node-1" when more
    than one node failed), or "" when the lines say nothing sortie can read. ``workdir_files``:
    the files the job's workdir sync sent, where a module the job lacks may be."""
    at = f":{where}{',' if where else ''} "  # said of the first failed node where several did
    if said := (_no_torch(tail) or _module_in_workdir(tail, workdir_files)
                or _known_cause(tail) or _arguments_refused(tail)):
        return at + said
    if aborted := _aborted_at_exit(tail, where, last_step_line):
        return aborted
    return at + said if (said := _raised(tail, workdir_files)) else ""


def _aborted_at_exit(tail: list[str], where: str, last_step_line: str | None) -> str:
    """A process aborting (`terminate called …`, SIGABRT): what the log says, and that it came
    after training when the job printed its last step (torch's gloo threads at the
    interpreter's exit: docs/your-job.md, "A process that aborts at exit")."""
    line = next((line for pattern in ABORT_LINES for line in tail if pattern.search(line)), None)
    if line is None:
        return ""
    line = line.strip()[:200]
    after = (f" after training ({last_step_line}): a known torch/gloo abort at the process's "
             "exit (docs/your-job.md)" if last_step_line else "")
    return f": a process of the job{where} aborted ({line!r}){after}"


def _no_torch(tail: list[str]) -> str:
    """The node's torchrun found no torch in the job's Python (`trainer/torchrun.NO_TORCH`):
    that line, less its mark."""
    line = next((line.strip() for line in tail if NO_TORCH in line), None)
    return line.split(NO_TORCH, 1)[1][:300] if line else ""


def _module_in_workdir(tail: list[str], files: tuple[str, ...]) -> str:
    """A module the job's Python lacks that the workdir has, at a directory Python does not
    look in: a script in a subdirectory (`src/train.py`) importing the workdir's own package,
    which the user's shell found through its PYTHONPATH (or `python -m`), never sent."""
    found = next((hit for line in tail if (hit := NO_MODULE.search(line))), None)
    if found is None or not files:
        return ""
    name = found.group(1)
    home = module_home(files, name.split(".")[0])
    if home is None:
        return ""
    return (f"the job's Python has no module '{name}', which the workdir has "
            f"({home[1]}): Python looks in the script's own directory, not "
            f"{'the workdir' if home[0] == '.' else home[0] + '/'}; `--env PYTHONPATH={home[0]}` "
            "adds it (`env:` in a task file), or `pip install -e .` in the setup where the "
            "workdir is a package")


def _arguments_refused(tail: list[str]) -> str:
    """The script's own argument parser refusing what it was given (argparse: its usage line,
    then `train.py: error: ...`): said, with where a job's arguments go."""
    if not any(USAGE.match(line) for line in tail):
        return ""
    found = next((hit for line in tail if (hit := ARGUMENTS_REFUSED.match(line))), None)
    return (f"the script refused its arguments ({found.group(1)}: error: "
            f"{found.group(2).strip()[:200]}): a job's arguments go after `--` (`sortie run ... -- "
            "--epochs 3`), a task's in `args:`" if found else "")


def _known_cause(tail: list[str]) -> str:
    """One of KNOWN_CAUSES: its advice."""
    return next((found.expand(advice) for pattern, advice in KNOWN_CAUSES
                 for line in tail if (found := pattern.search(line))), "")


def _raised(tail: list[str], files: tuple[str, ...] = ()) -> str:
    """The first exception a rank raised, by its rank where torchrun's prefix says it, and
    where in the workdir's files (``files``) it was raised, where its traceback says."""
    for index, line in enumerate(tail):
        if (found := RAISED.match(line)) and not CONSEQUENCE.search(line):
            who = f"rank {found.group(1)}" if found.group(1) else "a process"
            at = _place(tail[:index], found.group(1), files)
            return f"{who} raised {found.group(2)}{at}: {found.group(3).strip()}"
    return ""


def _place(before: list[str], rank: str | None, files: tuple[str, ...]) -> str:
    """" at train.py:14": the innermost frame of the traceback (``before`` its exception's line,
    the same rank's) in a file of the workdir (the node's copy of it: its path there ends with
    the file's), or of a SyntaxError the line Python could not read; "" where none is."""
    for line in reversed(before[-60:]):
        frame = FRAME.match(line)
        if frame is None or frame.group(1) != rank:
            if "Traceback (most recent call last)" in line and \
                    (rank is None or f"[rank{rank}]" in line):
                return ""  # the top of its traceback: an earlier one's frames are not its own
            continue
        path = frame.group(2)
        mine = [f for f in files if path == f or path.endswith("/" + f)]
        if mine:
            return f" at {max(mine, key=len)}:{frame.group(3)}"
    return ""
