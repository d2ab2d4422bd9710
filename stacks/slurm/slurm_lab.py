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
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from sortie.core import statefile
from sortie.core.errors import SortieError
from sortie.stacks.machine.loopback import find_sshd, keygen, start_sshd
from sortie.stacks.machine.node_network import NETNS_DIR, NodeNetwork, sftp_server

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scontrol", "scancel",
           "slurmdbd", "sacct", "sacctmgr", "mariadbd", "mariadb-install-db", "mariadb")
START_TIMEOUT_S = 60.0
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


@dataclass
class SlurmLab:
    state: Path
    nodes: int = 2
    cpus: int = 2
    # Partition name -> Slurm's own partition line after its nodes ("AllowAccounts=lab").
    partitions: dict[str, str] = field(default_factory=lambda: {"debug": "Default=YES"})
    accounting: bool = True  # slurmdbd on a MariaDB of its own; False: as many sites run it
    network: NodeNetwork = field(init=False)

    def __post_init__(self) -> None:
        self.state = self.state.resolve()
        self.network = NodeNetwork(self.state)

    # -- names -----------------------------------------------------------------------------------

    def hostname(self, index: int) -> str:
        return f"n{index}"

    @property
    def conf(self) -> Path:
        return self.state / "slurm.conf"

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
        """A command's prefix that runs it on the login node (in its namespace)."""
        return ["nsenter", f"--net={NETNS_DIR / self.network.namespace(0)}", "--"]

    def node_list(self) -> str:
        return ",".join(self.hostname(i) for i in range(1, self.nodes + 1))

    # -- start and stop --------------------------------------------------------------------------

    def start(self) -> None:
        missing = missing_tools()
        if missing:
            raise SortieError(f"a Slurm lab needs {', '.join(missing)}")
        for sub in ("munge", "ctld", "log"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        (self.sockets / "spool").mkdir(parents=True, exist_ok=True, mode=0o700)
        self.network.create()
        for index in range(self.nodes + 1):  # each node's interface named its own, as sites'
            self.network.add_node(index, f"eth-{self.hostname(index)}" if index else "eth0")
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
            "nsenter", f"--net={NETNS_DIR / self.network.namespace(index)}", "unshare",
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
        statefile.write_text(self.state / "slurmdbd.conf", self._slurmdbd_conf())  # 0600
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
                        f"CPUs={self.cpus} RealMemory=2000 State=UNKNOWN\n"
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
                "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
                "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
                "MpiDefault=none\nReturnToService=2\nJobAcctGatherType=jobacct_gather/none\n"
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
