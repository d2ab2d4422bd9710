"""A real Slurm on this machine, to test and measure sortie's Slurm backend against (as root).

Debian's own daemons (`slurm-wlm`, `munge`), nothing imitated: `munged` on a socket of its own,
`slurmctld` in the login namespace (node 0 of a `NodeNetwork`) and one `slurmd` per compute node
in a namespace of its own, each under `unshare --uts` with its node's host name. The cluster's
configuration is its own (`SLURM_CONF`, `/etc` untouched): `lab.environment()` is what a shell on
its login node has. Its nodes share this machine's file system, as a Slurm cluster's nodes share
their NFS home. The login node has no address outside its namespace: whatever talks to Slurm runs
in it (`lab.login_prefix()`).

    lab = SlurmLab(state_dir, nodes=3, partitions={"debug": "Default=YES"}); lab.start() ...
    lab.stop()

A partition of a higher `PriorityTier` preempts the others' jobs: they are signalled, given their
partition's `GraceTime`, and requeued (`PreemptType=preempt/partition_prio`,
`PreemptMode=REQUEUE`).

As sites run it: memory is counted per job and enforced (`CR_CPU_Memory`, `DefMemPerCPU`: a step
past its allocation's memory is killed, `OverMemoryKill`), and jobs run as an ordinary user
(`lab_user`: an account made once per machine, as the lab's packages are installed once),
seeing this controller's Python where a site keeps its own, on a disk every user reads
(`lab_view`: this machine's may be under a directory only root enters).
Each node declares more CPUs than this machine has (`config_overrides`), so that sorties share
nodes as they do on a site's larger ones (but for a lab that binds tasks to cores).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import sortie
from sortie.core import statefile
from sortie.core.errors import SortieError
from sortie.stacks.machine.loopback import find_sshd, keygen, start_sshd
from sortie.stacks.machine.node_network import NETNS_DIR, NodeNetwork, sftp_server
from sortie.stacks.slurm.lab_view import closed_ways, view_script

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scontrol", "scancel",
           "slurmdbd", "sacct", "sacctmgr", "mariadbd", "mariadb-install-db", "mariadb")
START_TIMEOUT_S = 60.0
VIEW_PID = "view.pid"  # the process that holds the users' view (`lab_view`)
RUN_DIR = Path("/run")  # (root's: a lab needs root)
LOGIN_ADDRESS = "127.0.0.1"  # the login node's sshd: this machine's loopback, as a site's LAN


def missing_tools() -> list[str]:
    """What this machine lacks to run a Slurm lab (`apt-get install slurm-wlm slurmdbd
    mariadb-server munge`, root)."""
    missing = [tool for tool in (*DAEMONS, "ip", "nsenter", "unshare") if not shutil.which(tool)]
    return missing + (["root"] if os.geteuid() != 0 else [])


@dataclass(frozen=True)
class LoginSsh:
    """How to reach a lab's login node over SSH."""

    address: str
    port: int
    host_key: str  # "ssh-ed25519 AAAA..."
    client_key: Path


@dataclass(frozen=True)
class LabUser:
    """An ordinary account that runs a lab's jobs (no root, its own home)."""

    name: str
    uid: int
    gid: int
    home: Path

    def runs(self) -> list[str]:
        """A command's prefix (run as root) that runs it as this user."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--"]

    def environment(self) -> dict[str, str]:
        return {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name}


def lab_user(name: str = "sortie-lab") -> LabUser:
    """The account ``name``, made (`useradd --create-home`) where this machine lacks it; never
    removed: another lab may be using it."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name],
                       check=False, capture_output=True, timeout=60)  # (two labs: one wins)
        entry = pwd.getpwnam(name)
    return LabUser(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))


@dataclass
class SlurmLab:
    state: Path
    nodes: int = 2
    cpus: int = 4  # each node's, as declared (`config_overrides`: more than this machine has)
    memory_mb: int = 4000  # each node's, as declared
    mem_per_cpu_mb: int = 600  # a job's memory when it asks for none: per CPU it holds
    # Partition name -> Slurm's own partition line after its nodes ("AllowAccounts=lab").
    partitions: dict[str, str] = field(default_factory=lambda: {"debug": "Default=YES"})
    accounting: bool = True  # slurmdbd on a MariaDB of its own; False: as many sites run it
    # Each task bound to the cores it was given (`task/affinity`, `TaskPluginParam=Cores`), as
    # many sites do; False: `task/none`, as many others. Binding lays tasks out on this
    # machine's own CPUs: a lab that binds declares no more `cpus` than this machine has.
    binds_cores: bool = False
    network: NodeNetwork = field(init=False)

    def __post_init__(self) -> None:
        self.state = self.state.resolve()
        self.network = NodeNetwork(self.state)

    # -- names -----------------------------------------------------------------------------------

    def hostname(self, index: int) -> str:
        return f"n{index}"

    @property
    def conf(self) -> Path:
        """Beside its sockets, where its users read it (as a site's /etc/slurm: the state may
        be in a directory only root enters)."""
        return self.sockets / "slurm.conf"

    @property
    def sockets(self) -> Path:
        """Where its Unix sockets live (munged's, MariaDB's, each slurmstepd's in the spool):
        a short path of its own, whatever the state's (a socket's path is at most 107 bytes:
        a lab in a deep `$SORTIE_HOME` had every batch job fail to start)."""
        digest = hashlib.sha256(str(self.state).encode()).hexdigest()[:10]
        return RUN_DIR / f"sortie-slurm-{digest}"

    @property
    def munge_socket(self) -> Path:
        return self.sockets / "munge.socket"

    def environment(self) -> dict[str, str]:
        """What a shell on the login node has: this cluster's configuration."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def login_prefix(self) -> list[str]:
        """A command's prefix that runs it on the login node (in its namespace, with the
        users' view of the file system)."""
        return ["nsenter", f"--net={NETNS_DIR / self.network.namespace(0)}", *self._view(), "--"]

    def _view(self) -> list[str]:
        """nsenter's options that enter the users' view (`lab_view`); none without one."""
        try:
            holder = int((self.sockets / VIEW_PID).read_text())
        except (OSError, ValueError):
            return []
        return ["--wd=.", f"--mount=/proc/{holder}/ns/mnt"]

    def _open_view(self) -> None:
        """The users' view, where what they run (this Python, this checkout) is under a
        directory they may not enter: a mount namespace held by a process that sleeps. The
        lab's own directory stays in sight there (its daemons' files, the shared directory)."""
        ways = closed_ways([Path(sys.executable), Path(sys.base_prefix),
                            Path(sortie.__file__).parent], kept=[self.state])
        if not ways:
            return
        ready = self.sockets / "view-ready"
        with open(self.state / "log" / "view.out", "ab") as log:
            holder = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 f"{view_script(ways, self.sockets / 'view')}\ntouch {ready}\n"
                 "exec sleep infinity"], start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=log)
        statefile.write_text(self.sockets / VIEW_PID, f"{holder.pid}\n")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            if holder.poll() is not None or time.monotonic() > deadline:
                raise SortieError(f"the Slurm lab's view for its users did not open: see "
                                  f"{self.state / 'log' / 'view.out'}")
            time.sleep(0.05)

    def node_list(self) -> str:
        return ",".join(self.hostname(i) for i in range(1, self.nodes + 1))

    # -- start and stop --------------------------------------------------------------------------

    def start(self) -> None:
        missing = missing_tools()
        if missing:
            raise SortieError(f"a Slurm lab needs {', '.join(missing)}")
        for sub in ("munge", "ctld", "log"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        # 0755, as a site's /var/spool/slurmd: a batch script in it runs as the job's user.
        (self.sockets / "spool").mkdir(parents=True, exist_ok=True, mode=0o755)
        self.network.create()
        for index in range(self.nodes + 1):  # each node's interface named its own, as sites'
            self.network.add_node(index, f"eth-{self.hostname(index)}" if index else "eth0")
        self._open_view()
        self._start_munge()
        self.conf.write_text(self._slurm_conf())
        if self.accounting:
            self._start_accounting()
        controller = self.network.namespace(0)
        self._spawn("slurmctld", ["ip", "netns", "exec", controller, "unshare", "--uts", "sh",
                                  "-c", f"hostname ctl; exec slurmctld -D -i -f {self.conf}"])
        for index in range(1, self.nodes + 1):
            self.start_node(index)
        self.wait_idle()

    def start_node(self, index: int) -> None:
        """slurmd of node ``index``; `nsenter --net`, not `ip netns exec` (which remounts /sys,
        where slurmd then finds no cgroup file system)."""
        name = self.hostname(index)
        self._spawn(f"slurmd-{name}", [
            "nsenter", f"--net={NETNS_DIR / self.network.namespace(index)}", *self._view(),
            "unshare",
            "--uts", "sh", "-c", f"hostname {name}; exec slurmd -D -f {self.conf} -N {name}"])

    def stop_node(self, index: int) -> None:
        """Kill node ``index``'s slurmd and everything running in its namespace: a node lost."""
        for pid in self.network.pids(index):
            with_pid_gone(pid, signal.SIGKILL)

    def wait_idle(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.login("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
            idle = [s for s in states[1::2] if s in ("idle", "mix", "alloc")]
            if len(idle) >= self.nodes:
                return
            time.sleep(0.2)
        raise SortieError(f"the Slurm lab's nodes did not come up within {timeout:.0f}s; see "
                          f"{self.state / 'log'}")

    def open_login_ssh(self, user: str) -> LoginSsh:
        """An sshd for the login node, as a site's: on this machine's loopback, every session
        (a command, sftp, a shell) in the login node's namespace with its Slurm configuration,
        ``user`` logging in with a key of its own. For a controller elsewhere (`sortie attach
        NAME --slurm USER@LOGIN`)."""
        where = self.state / "login-ssh"
        where.mkdir(exist_ok=True)
        host_key = keygen(where / "ssh_host_ed25519_key", "slurm-lab-login")
        client_key = where / "client_key"
        statefile.write_text(where / "authorized_keys", keygen(client_key, user) + "\n")
        enter = self.network.enter_script(0).replace(
            "#!/bin/sh\n", f"#!/bin/sh\nexport SLURM_CONF={shlex.quote(str(self.conf))}\n", 1)
        port = start_sshd(find_sshd(), where, LOGIN_ADDRESS, where, user, enter=enter,
                          sftp=sftp_server() or "")
        return LoginSsh(LOGIN_ADDRESS, port, host_key, client_key)

    def stop(self) -> None:
        sshd = self.state / "login-ssh" / "sshd.pid"
        if sshd.is_file():
            with_pid_gone(int(sshd.read_text().split()[0]), signal.SIGKILL)
        for pid in self.network.pids():
            with_pid_gone(pid, signal.SIGKILL)
        pid_file = self.state / "munge" / "munged.pid"
        if pid_file.is_file():
            with_pid_gone(int(pid_file.read_text().split()[0]), signal.SIGTERM)
        with contextlib.suppress(OSError, ValueError):
            holder = int((self.sockets / VIEW_PID).read_text())
            if Path(f"/proc/{holder}/cmdline").read_bytes() == b"sleep\0infinity\0":
                with_pid_gone(holder, signal.SIGKILL)  # (never a pid since reused)
        self.network.destroy()
        shutil.rmtree(self.sockets, ignore_errors=True)

    def login(self, *argv: str, check: bool = True, timeout: float = 30.0
              ) -> subprocess.CompletedProcess[str]:
        """Run a command on the login node (a Slurm client there)."""
        return subprocess.run([*self.login_prefix(), *argv], env=self.environment(),
                              capture_output=True, text=True, check=check, timeout=timeout)

    # -- inside ----------------------------------------------------------------------------------

    def _start_munge(self) -> None:
        key = self.state / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        munge = self.state / "munge"
        subprocess.run(["munged", f"--key-file={key}", f"--socket={self.munge_socket}",
                        f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                        f"--seed-file={munge / 'munged.seed'}", "--force"],
                       check=True, capture_output=True, timeout=30)

    def _start_accounting(self) -> None:
        """Slurm's accounting as sites keep it: `slurmdbd` on a MariaDB of the lab's own, both
        in the controller's namespace, and the cluster registered (`sacctmgr`) before
        slurmctld starts. `sacct` then answers for every job."""
        db, tmp = self.state / "db", self.state / "db-tmp"
        tmp.mkdir(exist_ok=True)  # its own: two servers' temporary tables in one /tmp crash it
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={db}", f"--tmpdir={tmp}",
                        "--user=root", "--auth-root-authentication-method=normal",
                        "--skip-test-db"], check=True, capture_output=True, timeout=120)
        socket = self.sockets / "mariadb.sock"
        self._spawn("mariadbd", [*self.login_prefix(), "mariadbd", "--no-defaults",
                                 f"--datadir={db}", f"--tmpdir={tmp}", f"--socket={socket}",
                                 "--user=root",
                                 "--bind-address=127.0.0.1", "--port=3306",
                                 f"--pid-file={db / 'mariadbd.pid'}"])
        grant = ("CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'lab'; "
                 "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        self._until_ok(["mariadb", "--no-defaults", f"--socket={socket}", "-uroot", "-e", grant],
                       "MariaDB")
        # 0600, beside slurm.conf (where slurmdbd looks for it)
        statefile.write_text(self.conf.parent / "slurmdbd.conf", self._slurmdbd_conf())
        self._spawn("slurmdbd", [*self.login_prefix(), "unshare", "--uts", "sh", "-c",
                                 "hostname ctl; exec slurmdbd -D"])
        self._until_ok(["sacctmgr", "-i", "add", "cluster", "lab"], "slurmdbd")

    def _until_ok(self, argv: list[str], what: str) -> None:
        deadline, done = time.monotonic() + START_TIMEOUT_S, None
        while time.monotonic() < deadline:
            done = self.login(*argv, check=False)
            if done.returncode == 0:
                return
            time.sleep(0.2)
        said = done.stderr.strip()[-300:] if done else ""
        raise SortieError(f"the Slurm lab's {what} did not answer within {START_TIMEOUT_S:.0f}s"
                          f": {said} (see {self.state / 'log'})")

    def _slurmdbd_conf(self) -> str:
        return (f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\n"
                f"DbdHost=ctl\nDbdAddr={self.network.address(0)}\nSlurmUser=root\n"
                f"LogFile={self.state / 'log' / 'slurmdbd.log'}\n"
                f"PidFile={self.state / 'slurmdbd.pid'}\n"
                "StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\n"
                "StoragePort=3306\nStorageUser=slurm\nStoragePass=lab\n")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.state / "log" / f"{name}.out", "ab")  # noqa: SIM115 - the daemon's
        with log:
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=self.environment(),
                             start_new_session=True)

    def _slurm_conf(self) -> str:
        state, log, spool = self.state, self.state / "log", self.sockets / "spool"
        nodes = "".join(f"NodeName={self.hostname(i)} NodeAddr={self.network.address(i)} "
                        f"CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN\n"
                        for i in range(1, self.nodes + 1))
        partitions = "".join(f"PartitionName={name} Nodes={self.node_list()} MaxTime=INFINITE "
                             f"State=UP {extra}\n" for name, extra in self.partitions.items())
        return (f"ClusterName=lab\nSlurmctldHost=ctl({self.network.address(0)})\n"
                f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\n"
                "SlurmUser=root\nSlurmdUser=root\n"
                f"StateSaveLocation={state / 'ctld'}\nSlurmdSpoolDir={spool}/%n\n"
                f"SlurmctldPidFile={state / 'slurmctld.pid'}\n"
                f"SlurmdPidFile={spool}/slurmd.%n.pid\n"
                f"SlurmctldLogFile={log / 'slurmctld.log'}\nSlurmdLogFile={log}/slurmd.%n.log\n"
                "ProctrackType=proctrack/linuxproc\n"
                + ("TaskPlugin=task/affinity\nTaskPluginParam=Cores\n" if self.binds_cores
                   else "TaskPlugin=task/none\n") +
                "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU_Memory\n"
                f"DefMemPerCPU={self.mem_per_cpu_mb}\nSlurmdParameters=config_overrides\n"
                # Each step's memory read every second; past its allocation's, it is killed.
                "JobAcctGatherType=jobacct_gather/linux\nJobAcctGatherParams=OverMemoryKill\n"
                "JobAcctGatherFrequency=task=1\n"
                "MpiDefault=none\nReturnToService=2\n"
                + ("AccountingStorageType=accounting_storage/slurmdbd\n"
                   f"AccountingStorageHost={self.network.address(0)}\n"
                   # With MUNGE, the socket to reach slurmdbd by (not AuthInfo's).
                   f"AccountingStoragePass={self.munge_socket}\n" if self.accounting else
                   "AccountingStorageType=accounting_storage/none\n") +
                "SchedulerType=sched/backfill\nSlurmdTimeout=30\nInactiveLimit=0\n"
                "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE\n"
                "KillWait=5\nMinJobAge=300\n"
                f"{nodes}{partitions}")


def with_pid_gone(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
