"""HostProbe: gathers one Snapshot from the host (processes, unit, GPUs, logs, HTTP)."""
import os
import resource
import time

from ..host import container_engine, failed_starts, http_probe, hub_cache, infiniband, kernel_log, procfs, systemd
from ..common.command import run_command
from ..common.errors import InputError
from ..common.units import MIB
from ..host.gpu import GpuReader
from ..host.logs import FileTailer, JournalReader
from ..host.ranks import engine_ranks
from ..host.stacks import StackReader
from . import xid
from .snapshot import ProcessTree, Snapshot


STACK_SAMPLES = 3


class HostProbe(object):
    """Reads every signal the config names. Construct it after validation: it checks that the
    unit exists (or remembers the identity of the pid) and raises InputError otherwise.
    output: where else the server's output is read from (the launcher's pipe from its engine)."""

    def __init__(self, config, runner=run_command, proc_root="/proc", nvml=None, output=None):
        self.config = config
        self.runner = runner
        self.proc_root = proc_root
        self.counter = procfs.TreeCounter()
        self.accounting = systemd.UnitAccounting()  # unit mode: the cgroup's own CPU and reads, where accounted
        self.gpus = GpuReader(config.gpus, nvml=nvml, runner=runner)
        self.gpu_cpu_s = 0.0  # this process's CPU seconds in GPU reads (what the wait's cost report splits out)
        self.stacks = StackReader(config.py_spy, runner=runner, proc_root=proc_root)
        # Dumps per stack read and whether they read locals (host/stacks.py): three, with the
        # innermost frame's locals, so the classifier can tell Python at work on one hot line (it
        # holds the GIL and its locals change) from a busy-wait in one native call.
        self.stack_samples = STACK_SAMPLES
        self.stack_locals = True
        self.hub = hub_cache.HubCacheReader(config.unit, runner=runner, proc_root=proc_root)
        self.infiniband_root = infiniband.SYSFS_ROOT
        self.kernel_log = None  # host/kernel_log.KernelLog, from the server's start: made at the first look
        self.kernel_log_path = None  # None: /dev/kmsg (or MODELWAKE_KMSG_PATH, for tests)
        self.wait_start_usec = int(time.monotonic() * 1e6)  # the kernel log's clock: microseconds since boot
        self.wait_start_epoch = time.time()  # the clock of the launcher's record of failed starts
        self.zombies = {}  # unit mode: the unit's unreaped dead processes at the latest look
        self.reads_prev = (None, None)  # the tree's rchar and read_bytes at the previous look
        self.sources = []
        self.journal = None
        self.awaiting_next_run = False
        self.earlier_invocation = None
        self.root_start = None
        # runtime docker: the engine's container, found by its name (its init's PID kept between looks).
        self.docker_container = (container_engine.DockerContainer(config.engine_container)
                                 if config.engine_container else None)
        if config.unit:
            try:
                props = systemd.unit_properties(config.unit, runner)
            except systemd.SystemdError as exc:
                raise InputError("unit", "cannot ask systemd about %s: %s" % (config.unit, exc))
            if props.get("LoadState") == "not-found":
                raise InputError("unit", "unit %s does not exist on this host" % config.unit)
            # A wait begun while the unit stops (a restart's stop drains requests for up to
            # model_service_drain_seconds, and the stopping server still answers HTTP) is about the
            # run that follows: the stopping run's lines and answers are not its story. (A single look,
            # timeout 0, as the status playbook's, reports the stopping unit as it is.)
            self.awaiting_next_run = bool(config.timeout) and props.get("ActiveState") == "deactivating"
            self.earlier_invocation = (props.get("InvocationID") or None) if self.awaiting_next_run else None
            if not self.awaiting_next_run:
                self._follow_journal(props)
        else:
            root = procfs.read_process(config.pid, proc_root)
            if procfs.is_gone(root):
                self._refuse_a_stale_pid()
                config.pid_exited_before_wait = True
            else:
                # A pid can be reused: the start time tells the server from a newcomer.
                self.root_start = root["starttime"]
        if config.log_path:
            self.sources.append(FileTailer(config.log_path))
        if output is not None:
            self.sources.append(output)

    def _refuse_a_stale_pid(self):
        """The pid exited before the wait: a crash to judge from its log, unless another process serves
        the URL, which makes it a stale pid (the server restarted as another process): no verdict then."""
        if not self.config.log_path:
            raise InputError("pid", "no process with pid %d is running on this host" % self.config.pid)
        holder = procfs.listening_socket_owner(self.config.port(), self.proc_root) if self.config.url_is_local() else None
        if holder:
            who = "pid %d (%s)" % (holder["pid"], holder.get("comm") or "?") if holder.get("pid") else "another user's process"
            raise InputError("pid", "no process with pid %d is running on this host, and %s listens on port %d: give "
                                    "the server's current pid, or use unit" % (self.config.pid, who, self.config.port()))

    def _follow_journal(self, props):
        """Read the unit's journal from the run `props` (systemctl show) names on."""
        self.journal = JournalReader(self.config.unit, runner=self.runner,
                                     invocation_id=props.get("InvocationID") or None,
                                     main_pid=props.get("MainPID"), earlier_invocation=self.earlier_invocation)
        self.sources.insert(0, self.journal)

    def _earlier_run_stopping(self, unit):
        """{"invocation", "state", "pid"} while the run that was stopping when the wait began still
        stops, else None (it ended: the unit shows its next run, or no run at all)."""
        if unit is None or unit.get("ActiveState") != "deactivating":
            return None
        if (unit.get("InvocationID") or None) not in (None, self.earlier_invocation):
            return None  # a later run of the unit that stops in turn is this start's own story
        return {"invocation": self.earlier_invocation, "pid": unit.get("MainPID") or None,
                "state": "%s, %s" % (unit.get("ActiveState"), unit.get("SubState"))}

    def _unit_container_pids(self, main):
        """runtime docker: the processes of the container the unit's launcher names (--engine-container),
        outside the unit's cgroup; [] for any other unit."""
        info = procfs.read_process(main, self.proc_root) if main else None
        name = container_engine.launcher_container(info["cmdline"]) if info is not None else None
        if name is None or not systemd.is_launcher(info["cmdline"]):
            return []
        if self.docker_container is None or self.docker_container.name != name:
            self.docker_container = container_engine.DockerContainer(name)
        return self.docker_container.container_pids(self.proc_root)

    def _processes(self, unit):
        """(the root pid, {pid: info} of the server's processes, {pid: info} of modelwake's launcher
        and the tools it runs)."""
        if self.config.unit:
            if unit is None:
                return None, {}, {}
            main = unit.get("MainPID") or 0
            roots = procfs.cgroup_pids(unit.get("ControlGroup"), main, self.proc_root) or ([main] if main else [])
            roots = roots + [pid for pid in self._unit_container_pids(main) if pid not in roots]
            processes = procfs.tree(roots, self.proc_root)
            live = dict((p, i) for p, i in processes.items() if not procfs.is_gone(i))
            # Not the server's work any more, but how a dead rank ended: its exit status.
            self.zombies = dict((p, i) for p, i in processes.items() if p not in live)
            launcher = {}
            if main in live and systemd.is_launcher(live[main]["cmdline"]):
                # A notify unit's main process is modelwake's launcher: its own looks (HTTP probes, and
                # the py-spy and nvidia-smi it runs) are not the server's progress, nor its processes
                # (a py-spy caught in one look and gone at the next would change the tree twice).
                # They share its session; the engine runs in a session of its own. Count the engine only.
                session = live[main]["session"]
                launcher = dict((p, i) for p, i in live.items() if i["session"] == session)
                live = dict((p, i) for p, i in live.items() if i["session"] != session)
            return main or None, live, launcher
        root = procfs.read_process(self.config.pid, self.proc_root)
        if procfs.is_gone(root) or root["starttime"] != self.root_start:
            return self.config.pid, {}, {}
        roots = [self.config.pid]
        if self.config.engine_in_cgroup:
            roots = container_engine.engine_roots(self.config.pid, self.proc_root)
        elif self.docker_container is not None:
            roots = self.docker_container.engine_roots(self.config.pid, self.proc_root)
        return self.config.pid, procfs.tree(roots, self.proc_root), {}

    def snapshot(self, t, remaining=None, stacks=False):
        """One look. remaining: the most seconds the look may take, its reads included (None: the
        HTTP probes' own timeouts, completion_timeout for the completion); stacks: read the Python
        stacks of the server's processes too (the classifier asks)."""
        look_deadline = None if remaining is None else time.monotonic() + remaining
        cfg = self.config
        errors = []
        unit = None
        if cfg.unit:
            try:
                unit = systemd.unit_properties(cfg.unit, self.runner)
            except systemd.SystemdError as exc:
                errors.append(str(exc))
            if self.awaiting_next_run:
                stopping = self._earlier_run_stopping(unit)
                if stopping is not None:
                    return Snapshot(t=t, unit=unit, errors=errors, earlier_run=stopping)
                self.awaiting_next_run = False
                self._follow_journal(unit or {})
        root_pid, processes, launcher = self._processes(unit)
        cpu_seconds, read_bytes = self.counter.update(processes)
        # Written and socket bytes of the tree alone (a notify unit's launcher is outside it).
        io_totals = self.counter.io_totals()
        if unit is not None:
            launcher_work = (sum(i["own_ticks"] + i["child_ticks"] for i in launcher.values()) / float(procfs.CLK_TCK),
                             sum(i["read_bytes"] or 0 for i in launcher.values()))
            cpu_seconds, read_bytes = self.accounting.combine(cpu_seconds, read_bytes, unit, launcher_work)
        process = ProcessTree(
            root_pid=root_pid,
            alive=bool(processes) and (cfg.unit is not None or cfg.pid in processes),
            pids=sorted(processes),
            cpu_seconds=round(cpu_seconds, 2),
            read_bytes=read_bytes,
            write_bytes=io_totals["write_bytes"],
            rchar=io_totals["rchar"],
            wchar=io_totals["wchar"],
            states=dict((str(p), i["state"]) for p, i in processes.items()),
            comms=dict((str(p), i["comm"]) for p, i in processes.items()),
            cpu=dict((str(p), round(i["own_ticks"] / float(procfs.CLK_TCK), 2)) for p, i in processes.items()),
            # The processes the engine made ranks, by the titles it gave them (host/ranks.py): who died, by name.
            ranks=dict((str(p), rank) for p, rank in engine_ranks(processes).items()),
            # Weight files open while rchar outgrows read_bytes: the page cache, else a socket (a stream).
            weight_files_open=self._weight_files_open(processes, io_totals, read_bytes),
            # How the zombies among them ended (a dead rank its blocked parent has not reaped).
            exits=dict((str(p), i["exit_status"]) for p, i in list(processes.items()) + list(self.zombies.items())
                       if i.get("exit_status") is not None),
        )
        stack_read = None
        if stacks and processes:
            children_before = _children_cpu_s()
            # py-spy beside the engine's interpreter, else beside the launcher's (the host venv, for a container).
            stack_read = self.stacks.read(processes, samples=self.stack_samples, local_values=self.stack_locals,
                                          helpers=launcher)
            # What the py-spy runs cost: the classifier spaces the next read by it.
            stack_read["cpu_s"] = round(_children_cpu_s() - children_before, 4)
            if stack_read["unavailable"]:
                errors.append("stacks unavailable: %s" % stack_read["unavailable"])
        cpu_before = time.process_time()
        try:
            gpus = self.gpus.read()
        except Exception as exc:  # a driver error must not end the wait: GPUs are one signal of many
            gpus = []
            errors.append("GPU read failed: %s" % exc)
        self.gpu_cpu_s += time.process_time() - cpu_before
        if self.gpus.error and not self.gpus.no_gpu_tools:
            errors.append(self.gpus.error)
        xids = self._xids(root_pid)
        if self.kernel_log.error:
            errors.append(self.kernel_log.error)
        notes = ["kernel log: none on this host (%s)" % self.kernel_log.path] if self.kernel_log.absent else []
        new_lines, context = [], []
        for source in self.sources:
            lines = source.read_new()
            (context if source.last_read_context else new_lines).extend(lines)
            if getattr(source, "error", None):
                errors.append(source.error)
        http = http_probe.probe_ready(cfg.url, cfg.ready_check, cfg.model, cfg.api_key,
                                      health_timeout=min(http_probe.HEALTH_TIMEOUT, cfg.completion_timeout),
                                      completion_timeout=cfg.completion_timeout, deadline=look_deadline)
        listeners = None
        if http["listening"] and cfg.url_is_local():
            listeners = procfs.listening_socket_owners(cfg.port(), self.proc_root)
        ib_ports = infiniband.read_ports(self.infiniband_root)
        return Snapshot(t=t, process=process, unit=unit, gpus=gpus, log_lines=new_lines,
                        log_context=context, http=http, listeners=listeners, errors=errors, stacks=stack_read,
                        peers=self._peer_connections(),
                        downloads=self.hub.read(processes) if processes else None,
                        ib_rcv_bytes=infiniband.received_bytes(ib_ports), ib_ports=ib_ports or None,
                        load=procfs.load(self.proc_root), xids=xids,
                        crash_loop=self._crash_loop(unit), failed_start=self._failed_start(unit), notes=notes)

    def _xids(self, root_pid):
        """The kernel's Xid lines new since the previous look, from the server's start on, each with the
        index of the GPU it names (by PCI id)."""
        if self.kernel_log is None:
            self.kernel_log = kernel_log.KernelLog(since_usec=self._start_usec(root_pid), path=self.kernel_log_path)
            found = self.kernel_log.read_new()
            if self.kernel_log.error is None:
                self.gpus.pci_bus_ids()  # read while the driver answers: a fault may wedge it later
        else:
            found = self.kernel_log.read_new()
        xids = [dict(parsed, usec=record["usec"]) for parsed, record in
                ((xid.parse(record["message"]), record) for record in found) if parsed is not None]
        if xids:
            by_pci = dict((pci, index) for index, pci in self.gpus.pci_bus_ids().items())
            for record in xids:
                record["gpu"] = by_pci.get(record["pci"])
        return xids

    def _start_usec(self, root_pid):
        """When the server started, in microseconds since boot (the kernel log's clock): its root
        process's start, else the wait's."""
        start = self.root_start
        if start is None and root_pid:
            start = (procfs.read_process(root_pid, self.proc_root) or {}).get("starttime")
        if start is None:
            return self.wait_start_usec
        return min(self.wait_start_usec, int(start * 1e6 / procfs.CLK_TCK))

    def _crash_loop(self, unit):
        """The record of failed starts of a unit whose launcher stopped its crash loop, else None."""
        if (unit is None or systemd.is_running(unit) or unit.get("ExecMainStatus") != failed_starts.EXIT_CRASH_LOOP
                or unit.get("ExecMainCode") != systemd.CLD_EXITED):
            return None
        directory = systemd.state_dir(self.config.unit)
        try:
            return failed_starts.read_record(directory)
        except (OSError, ValueError) as exc:
            return {"error": "%s: %s" % (failed_starts.record_path(directory), exc)}

    def _failed_start(self, unit):
        """The failed start the unit's launcher recorded during this wait (host/failed_starts.py: its
        "cause", "started", "ended", "status" and the record's "evidence"), else None.

        Why from the record: the launcher writes it before it exits, so it is there when systemd's
        restart is seen, while the dead run's last lines may not be in the journal yet (journald reads
        a process's output in its own time). A unit without the launcher has no record: None."""
        if unit is None or not self.config.unit:
            return None
        path = failed_starts.record_path(systemd.state_dir(self.config.unit))
        try:
            if os.stat(path).st_mtime < self.wait_start_epoch:
                return None  # one stat per look: the record is read only once it changed in the wait
            record = failed_starts.read_record(os.path.dirname(path))
        except (OSError, ValueError):
            return None
        starts = [entry for entry in record.get("starts") or [] if (entry.get("ended") or 0) >= self.wait_start_epoch]
        return dict(starts[-1], evidence=list(record.get("evidence") or [])) if starts else None

    def _weight_files_open(self, processes, io_totals, read_bytes):
        """procfs.open_weight_files, asked only at a look where rchar grew by a MiB beyond read_bytes
        (the fd tables of a large tree are many readlinks); None at the others."""
        rchar = io_totals.get("rchar")
        previous, self.reads_prev = self.reads_prev, (rchar, read_bytes)
        if rchar is None or previous[0] is None:
            return None
        beyond_disk = (rchar - previous[0]) - ((read_bytes or 0) - (previous[1] or 0))
        if beyond_disk < MIB:
            return None
        return procfs.open_weight_files(sorted(processes), self.proc_root)

    def _peer_connections(self):
        """Per other node of a multi-node group, its connections to the dist-init port (either
        end: node 0 listens on it, the others connect to it)."""
        cfg = self.config
        if not cfg.peers:
            return None
        connections = procfs.established_connections(self.proc_root)
        found = {}
        for name, addresses in cfg.peers.items():
            found[name] = sorted("%s:%d>%d" % (remote, remote_port, local_port)
                                 for _local_address, local_port, remote, remote_port in connections
                                 if remote in addresses and cfg.peer_port in (local_port, remote_port))
        return found


def _children_cpu_s():
    """CPU seconds of the programs this process ran and reaped (py-spy, journalctl, nvidia-smi)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
