"""A real single-node SLURM cluster (slurmctld, slurmd, munge from Debian) started by the test suite.

scripts/setup.sh installs the packages; this starts the daemons with a config of its own under a
temporary directory and points clients at it through SLURM_CONF. It raises, never skips, when SLURM
cannot be started, so CI fails loudly.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(*cmd: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, **kwargs)


class LocalSlurm:
    """Start/stop a one-node cluster; `env` is what clients (sbatch, squeue) need."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _node_line(self) -> tuple[str, str]:
        out = _run("slurmd", "-C").stdout
        line = next(line for line in out.splitlines() if line.startswith("NodeName="))
        memory = int(re.search(r"RealMemory=(\d+)", line)[1])
        line = re.sub(r"RealMemory=\d+", f"RealMemory={int(memory * 0.9)}", line)
        name = re.search(r"NodeName=(\S+)", line)[1]
        return name, line

    def start(self, timeout: float = 60) -> LocalSlurm:
        for binary in ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol"):
            if shutil.which(binary) is None:
                raise RuntimeError(f"SLURM is not installed ({binary} missing): run scripts/setup.sh")
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        name, node = self._node_line()
        host = socket.gethostname().split(".")[0]
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=diagsafe-test",
                    f"SlurmctldHost={host}",
                    # ports of its own: a second test cluster, or a site's SLURM, may hold the defaults (6817/6818)
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CryptoType=crypto/munge",
                    "MpiDefault=none",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "ReturnToService=2",
                    "SwitchType=switch/none",
                    "SchedulerType=sched/backfill",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "JobCompType=jobcomp/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    f"StateSaveLocation={self.root / 'state'}",
                    f"SlurmdSpoolDir={self.root / 'spool'}",
                    f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={self.root / 'log' / 'slurmd.log'}",
                    f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
                    f"SlurmdPidFile={self.root / 'slurmd.pid'}",
                    "MailProg=/bin/true",
                    "DependencyParameters=kill_invalid_depend",
                    "MinJobAge=3600",
                    node,
                    f"PartitionName=debug Nodes={name} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        self._start_munge()
        self.procs.append(
            subprocess.Popen(
                ["slurmctld", "-D", "-c", "-f", str(self.conf)],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        self.procs.append(
            subprocess.Popen(
                ["slurmd", "-D", "-f", str(self.conf)],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = _run("sinfo", "-h", "-o", "%T", env=self.env).stdout.strip()
            if state == "idle":
                return self
            time.sleep(0.5)
        logs = (
            (self.root / "log" / "slurmctld.log").read_text()[-2000:]
            if (self.root / "log" / "slurmctld.log").exists()
            else ""
        )
        self.stop()
        raise RuntimeError(f"SLURM did not come up (node state '{state}'): {logs}")

    def _start_munge(self) -> None:
        socket_path = Path("/run/munge/munge.socket.2")
        if socket_path.exists() and _run("munge", "-n").returncode == 0:
            return
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        if not Path("/etc/munge/munge.key").exists():
            _run("runuser", "-u", "munge", "--", "mungekey", "--create")
        self.procs.append(
            subprocess.Popen(
                ["runuser", "-u", "munge", "--", "/usr/sbin/munged", "-F", "--force"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        for _ in range(100):
            if socket_path.exists():
                return
            time.sleep(0.1)
        raise RuntimeError("munged did not start")

    def wait(self, job_ids: list[str], timeout: float = 900) -> None:
        """Wait until none of the jobs is pending or running (squeue polled; sbatch --wait is slow)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            listed = _run("squeue", "-h", "-j", ",".join(job_ids), env=self.env)
            if listed.returncode == 0 and not listed.stdout.strip():
                return
            if listed.returncode != 0 and "Invalid job id" in listed.stderr:
                return  # every job ended and was purged
            time.sleep(1)  # still queued or running, or squeue timed out on a busy controller: ask again
        raise TimeoutError(f"jobs {job_ids} still queued after {timeout} s")

    def job_state(self, job_id: str) -> str:
        out = _run("scontrol", "show", "job", job_id, env=self.env).stdout
        match = re.search(r"JobState=(\S+)", out)
        return match[1] if match else "UNKNOWN"

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
        self.procs.clear()
