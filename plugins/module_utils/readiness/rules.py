"""The terminal rules: every way a wait can end other than `ready`, in one ordered table.

Each row names its rule, the evidence it needs, the verdict and its words, and the tests that prove it
both ways: a positive test where the evidence is real and the rule fires, and a negative control where
a healthy start looks like that evidence and must end `ready` (tests/unit/test_rules.py reads this
table and fails when a row lacks either, or names a test that does not exist; docs/readiness.md shows
the table and a test keeps the two equal).

The classifier (classifier.py) asks FAILURE_RULES in order before it asks whether the server is ready:
the first that returns a verdict ends the wait, so the order is the priority (a GPU fault before the
engine's crash line it causes; a stopped crash loop before its last run's line). HANG_RULES come after
`ready`: a server that answers is never called stalled.
"""
import dataclasses
from typing import Any, Callable, Optional, Tuple

from . import engines, wording, xid
from .phases import FAILED, STALLED, STARTING, TIMEOUT
from .verdict import Verdict

# A rank that exits 0, or whose end nobody saw (its parent reaped it between two looks), proves no
# death: a loader, a compile worker or a check may end so while the start goes on. It fails the start
# only when nothing at all moved for this long after it went (no log, no reads, no CPU of the tree's,
# no GPU memory, no HTTP or status change), or stall_timeout if that is shorter: the ranks left wait for it.
RANK_GONE_QUIET = 20.0
# A crash line read only in the log's first read (the tail of a file appended to across restarts) may be an
# earlier run's, after that run's own start line: while the server lives, it fails the start only when no
# start line of a new run came for this long (an engine prints its first line after its imports).
CONTEXT_CRASH_WAIT = 60.0
# What a rule returns when its evidence is there but the next look may bring its cause (a traceback, the
# engine's word on a dead rank): no verdict at this look, and no later rule judges it.
HOLD = "hold"


@dataclasses.dataclass
class Look(object):
    """What a rule reads: this look, its events, what the classifier remembers, the settings."""
    t: float  # seconds since the wait began
    snap: Any  # the Snapshot
    state: Any  # state.ClassifierState
    config: Any  # config.WaitConfig
    alive: bool  # the server runs (its unit active, or its pid alive)
    progressed: bool  # this look saw progress (events.LookEvents.progress)
    phase: Optional[str] = None  # the phase machine's phase (HANG_RULES only)
    quiet: float = 0.0  # seconds since the last progress (HANG_RULES only)
    cpu_rate: Optional[float] = None
    where: str = ""  # the ranks' recent stacks in words (HANG_RULES only)

    @property
    def proc(self):
        return self.snap.process

    def failed(self, msg, evidence=None):
        return Verdict(FAILED, msg, evidence=wording.crash_evidence(self.state) if evidence is None else evidence,
                       terminal=True)


@dataclasses.dataclass(frozen=True)
class Rule(object):
    name: str
    verdict: str  # failed, stalled or timeout
    needs: str  # the evidence it reads
    says: str  # the verdict's words, in short
    positive: Tuple[str, ...]  # tests where the evidence is real and the rule fires
    negative: Tuple[str, ...]  # tests where a healthy start looks like the evidence and ends ready
    check: Callable[[Look], Optional[Verdict]]


def _foreign_listener(look):
    """The first process outside the server's tree that listens on the URL's port, or None."""
    if not look.snap.listeners or not look.config.url_is_local():
        return None
    ours = set(look.proc.pids)
    foreign = [o for o in look.snap.listeners if o.get("pid") is not None and o["pid"] not in ours]
    return foreign[0] if foreign else None


def _port_note(look):
    # A server that died of "Address already in use" is best told who holds the port.
    holder = _foreign_listener(look)
    if not holder:
        return ""
    return "; port %d is held by another process (pid %d, %s)" % (look.config.port(), holder["pid"], holder.get("comm") or "?")


def _gone(look, hard=None):
    """The ranks gone whose rank no living process holds again: those that ended by a signal or a
    non-zero exit (hard=True), by an exit 0 or unseen (hard=False), or all (None)."""
    held = set(look.proc.ranks[key] for key in look.proc.living() if key in look.proc.ranks)
    return [gone for gone in look.state.ranks_gone
            if gone.rank not in held and (hard is None or gone.hard() == hard)]


# -- the rules, in their order -------------------------------------------------------------------
def xid_fault(look):
    for record in look.state.xids:
        if xid.is_fatal(record["code"]) and wording.xid_watched(look.config, record):
            meaning, _severity, action = xid.describe(record["code"])
            return look.failed("failed: %s reported Xid %d (%s): a fault of the GPU or its driver, not of the engine; %s"
                               % (wording.xid_gpu(record), record["code"], meaning, action),
                               evidence=[record["line"]] + wording.crash_evidence(look.state))
    return None


def crash_loop_stopped(look):
    """A unit whose launcher stopped a crash loop (exit status 7): the loop, not its last start, is the news."""
    record = look.snap.crash_loop
    if not look.config.unit or record is None:
        return None
    status = (look.snap.unit or {}).get("ExecMainStatus")
    stopped = record.get("stopped") or {}
    if stopped.get("message"):
        return look.failed("failed: %s (unit %s, exit status %s: restarting it would fail the same way)"
                           % (stopped["message"], look.config.unit, status),
                           evidence=list(record.get("evidence") or []) or None)
    return look.failed("failed: crash loop: unit %s's launcher stopped a crash loop (exit status %s), but its record "
                       "of failed starts says no more (%s); see its journal"
                       % (look.config.unit, status, record.get("error") or "it names no stopped loop"))


def fatal_log_line(look):
    st = look.state
    if st.fatal is None:
        return None
    if st.fatal_in_context and look.alive and look.t < CONTEXT_CRASH_WAIT:
        return None  # maybe an earlier run's: this run's start line would clear it (state.new_run)
    cause = engines.root_cause(st.tail, st.fatal)
    if cause[0] == st.fatal and look.alive and not st.fatal_waited:
        # No line names the cause yet: its traceback may arrive with the next look.
        st.fatal_waited = True
        return HOLD
    if st.fatal not in cause:
        # The line that says which process failed (`[... TP2] Scheduler hit an exception:`).
        cause = cause[:1] + [st.fatal] + cause[1:]
    # The engine's own word confirms the ranks it lost, however they ended.
    gone = _gone(look)
    earlier = " (in the log before this wait began, and no run started since)" if st.fatal_in_context else ""
    return look.failed("failed: the server logged a fatal error%s: %s%s%s"
                       % (earlier, cause[0].strip(), wording.rank_death_note(gone, look.proc), _port_note(look)),
                       evidence=cause)


def _unit_detail(unit):
    detail = "ActiveState=%s, SubState=%s, Result=%s, exit status %s" % (
        unit.get("ActiveState"), unit.get("SubState"), unit.get("Result"), unit.get("ExecMainStatus"))
    if unit.get("StatusText"):
        # A notify unit's last word, e.g. its launcher's "stalled: no progress for 600 s ...".
        detail += '; status "%s"' % unit["StatusText"][:300]
    return detail


def _unit(look):
    return look.snap.unit if look.config.unit else None


def unit_not_found(look):
    unit = _unit(look)
    if unit is None or unit.get("LoadState") != "not-found":
        return None
    return Verdict(FAILED, "failed: unit %s does not exist" % look.config.unit, terminal=True)


def _crash_cause(look):
    """(`: <what the run died of>`, the evidence) of a unit's run that ended in the wait: the exception in
    its log, else the failed start its launcher recorded (which is there before the run's last lines reach
    the journal: journald reads a dead process's output in its own time), else ("", the log's evidence)."""
    evidence = wording.crash_evidence(look.state)
    note = _exception_note(evidence)
    recorded = look.snap.failed_start
    if note or not recorded or not recorded.get("cause"):
        return note, evidence
    return ": %s" % recorded["cause"].strip()[:300], list(recorded.get("evidence") or []) or evidence


def unit_restarted(look):
    """NRestarts up, or a new MainPID: the server crashed and systemd started it again (a crash can exit 0)."""
    unit, st, name = _unit(look), look.state, look.config.unit
    if unit is None:
        return None
    restarts, main_pid = unit.get("NRestarts"), unit.get("MainPID") or 0
    if restarts is not None and st.nrestarts is not None and restarts > st.nrestarts:
        cause, evidence = _crash_cause(look)
        return look.failed("failed: unit %s restarted %d time(s) during the wait (NRestarts %s -> %s; %s): its server "
                           "crashed%s" % (name, restarts - st.nrestarts, st.nrestarts, restarts, _unit_detail(unit), cause),
                           evidence=evidence)
    if st.main_pid and main_pid and main_pid != st.main_pid:
        cause, evidence = _crash_cause(look)
        return look.failed("failed: unit %s's main process changed from %s to %s %s into the wait: the server restarted "
                           "(%s)%s" % (name, st.main_pid, main_pid, wording.secs(look.t), _unit_detail(unit), cause),
                           evidence=evidence)
    if unit.get("SubState") == "auto-restart":
        cause, evidence = _crash_cause(look)
        return look.failed("failed: unit %s's process exited and systemd waits to restart it (%s)%s"
                           % (name, _unit_detail(unit), cause), evidence=evidence)
    return None


def unit_ended(look):
    """The unit failed, or stopped after it was seen running."""
    unit, name = _unit(look), look.config.unit
    if unit is None:
        return None
    if unit.get("ActiveState") == "failed":
        cause, evidence = _crash_cause(look)
        return look.failed("failed: unit %s failed (%s)%s" % (name, _unit_detail(unit), cause), evidence=evidence)
    running = unit.get("ActiveState") in ("active", "activating", "reloading")
    if not running and look.state.seen_running:
        cause, evidence = _crash_cause(look)
        return look.failed("failed: unit %s stopped %s into the wait (%s); a crash can exit 0%s"
                           % (name, wording.secs(look.t), _unit_detail(unit), cause), evidence=evidence)
    return None


def _exception_note(evidence):
    """`: <the exception>` when the crash evidence starts with one: what a server died of belongs in the
    message, not only in the evidence."""
    return ": %s" % evidence[0].strip()[:300] if evidence and engines.EXCEPTION_LINE.search(evidence[0]) else ""


def _last_line_note(state):
    """`; its log ends: <the last line>`, or `; its log is empty`: what a process that left no exception said last."""
    return "; its log ends: %s" % state.tail[-1].strip()[:300] if state.tail else "; its log is empty"


def process_exited(look):
    """Pid mode: the watched process is gone."""
    if look.config.unit or look.alive:
        return None
    pid = look.proc.root_pid or look.config.pid
    evidence = wording.crash_evidence(look.state)
    if look.config.pid_exited_before_wait:
        return look.failed("failed: process %s had exited before the wait began%s%s"
                           % (pid, _exception_note(evidence) or _last_line_note(look.state), _port_note(look)),
                           evidence=evidence)
    return look.failed("failed: process %s exited %s into the wait, in phase %s%s%s"
                       % (pid, wording.secs(look.t), look.state.phase or STARTING, _exception_note(evidence),
                          _port_note(look)),
                       evidence=evidence)


def rank_died(look):
    """A rank killed by a signal or dead of a non-zero exit, the server up: the others wait for it forever.
    Its parent may still say which and why (SGLang's `Rank 0 scheduler is dead`), or exit: one more look
    waits for that, as for a fatal line's traceback."""
    deaths = _gone(look, hard=True)
    if not deaths or not look.alive:
        return None
    if not look.state.rank_death_waited:
        look.state.rank_death_waited = True
        return HOLD
    return look.failed("failed: %s %s into the wait, in phase %s, with no error in the log%s"
                       % (wording.rank_death_note(deaths, look.proc)[2:], wording.secs(look.t),
                          look.state.phase or STARTING, _port_note(look)))


def rank_gone_quiet(look):
    """A rank that exited 0 or was reaped unseen, and nothing moved from its end on for RANK_GONE_QUIET
    seconds. Once the start made progress after such an end, the end is a note for good: a later silence
    is the stall rule's to judge."""
    ends = [gone for gone in _gone(look, hard=False) if not gone.went_on]
    if not ends or not look.alive or look.progressed:
        return None
    since = max(gone.t for gone in ends)
    if look.t - since < min(RANK_GONE_QUIET, look.config.stall_timeout):
        return None
    return look.failed("failed: %s at +%s, and nothing has moved since (no log, no reads, no CPU, no HTTP change) for "
                       "%s: the ranks left wait for it; still alive: %s"
                       % ("; ".join(wording.rank_gone(g) for g in ends), wording.secs(ends[0].t),
                          wording.secs(look.t - since), ", ".join(wording.survivors(look.proc)[:12])))


def peer_left(look):
    """After this node's own end: a node whose engine died sees its connection gone too."""
    left = look.state.peers.first_left()
    if left is None:
        return None
    when, name = left
    return look.failed("failed: %s left the group at +%s: its connections to the dist-init port %d closed, and the "
                       "nodes left wait in a collective that cannot complete without it; restart every node of the "
                       "group together" % (wording.peer_name(look.config, name), wording.secs(when), look.config.peer_port))


def vllm_engine_dead(look):
    if look.state.engine == "vllm" and look.snap.http is not None and look.snap.http.status("health") == 503:
        # The exception the core died of, when the log has one: also a fatal line written just before the
        # wait's first look, which the fatal-line rule leaves to a new run's start line for a while.
        evidence = wording.crash_evidence(look.state)
        return look.failed("failed: vLLM's /health answers 503: its engine core is dead%s" % _exception_note(evidence),
                           evidence=evidence)
    return None


def port_held(look):
    holder = _foreign_listener(look)
    if not holder or not look.proc.pids:
        return None
    return look.failed("failed: port %d is held by another process (pid %d, %s), not by the server's processes %s: "
                       "stop it or change the port" % (look.config.port(), holder["pid"], holder.get("comm") or "?",
                                                       sorted(look.proc.pids)[:8]))


def stalled(look):
    if look.quiet < look.config.stall_timeout:
        return None
    was_ready = _was_ready(look)
    # A server that had been ready is in no start phase: saying "initializing" would send the reader to
    # the start, when it is the running server that stopped answering.
    where = ("%s: it answers nothing" % was_ready) if was_ready else "in phase %s" % look.phase
    return Verdict(STALLED, "stalled: no progress for %s %s (last progress: %s at +%s; %s)%s"
                   % (wording.secs(look.quiet), where, look.state.last_progress,
                      wording.secs(look.state.last_progress_t), wording.picture(look.state, look.snap, look.proc, look.cpu_rate),
                      _hang_notes(look)), evidence=wording.hang_evidence(look.state, look.snap.http), terminal=True)


def _was_ready(look):
    """Words for a server that had been ready before it stopped answering, or None: its launcher said so
    to systemd (a notify unit active with its "ready in ..." status), or the engine logged that it was."""
    unit = look.snap.unit or {}
    status = unit.get("StatusText") or ""
    if unit.get("Type") == "notify" and unit.get("ActiveState") == "active" and status.startswith("ready"):
        return "after it had been ready (its launcher told systemd: %s)" % status
    if look.state.ready_hint:
        return "after the engine logged that it was ready"
    return None


def timeout(look):
    if not look.config.timeout or look.t < look.config.timeout:
        return None
    return Verdict(TIMEOUT, "timeout: not ready after %s; in phase %s since +%s, last progress %s ago (%s); %s%s"
                   % (wording.secs(look.t), look.phase, wording.secs(look.state.phase_start(look.phase, look.t)),
                      wording.secs(look.quiet), look.state.last_progress,
                      wording.picture(look.state, look.snap, look.proc, look.cpu_rate), _hang_notes(look)),
                   evidence=wording.hang_evidence(look.state, look.snap.http), terminal=True)


def _hang_notes(look):
    st = look.state
    return (wording.http_notes(st, look.config, look.snap.http) + wording.peer_notes(st, look.config)
            + wording.network_note(st, look.snap, look.t) + wording.saturation_note(look.snap.load)
            + (st.spin_note or "") + look.where)


# Where the tests named in the rows live: the replayed traces, and the live runs through Ansible.
UNIT = "tests/unit/"
LIVE = "tests/integration/"
FAILURE_RULES = (
    Rule("xid_fault", FAILED, "a fatal NVIDIA Xid in the kernel log on a watched GPU",
         "failed: GPU N (PCI ...) reported Xid 79 (...): a fault of the GPU or its driver, not of the engine",
         (UNIT + "test_xid.py::test_a_fatal_xid_on_a_watched_gpu_fails_the_wait_naming_the_gpu_the_code_and_its_meaning",),
         (UNIT + "test_xid.py::test_a_fatal_xid_on_a_gpu_the_wait_does_not_watch_is_only_quoted",
          LIVE + "test_rule_controls.py::test_an_application_xid_on_a_watched_gpu_and_a_fatal_one_on_another_gpu_end_ready"),
         xid_fault),
    Rule("crash_loop_stopped", FAILED, "unit mode: the launcher stopped a crash loop (exit status 7) and recorded why",
         "failed: <the loop's cause> (unit U, exit status 7: restarting it would fail the same way)",
         (UNIT + "test_crash_loop.py::test_a_wait_that_begins_on_a_stopped_loop_names_it_before_the_last_runs_own_error",),
         (UNIT + "test_rules.py::test_a_unit_with_no_stopped_loop_is_judged_by_its_run",),
         crash_loop_stopped),
    Rule("fatal_log_line", FAILED, "a crash line of the current run in the log (one more look for its traceback); one "
         "read only in the log's first read, while the server lives, after %d s with no new run's start line"
         % CONTEXT_CRASH_WAIT,
         "failed: the server logged a fatal error: <the line that names the cause>",
         (UNIT + "test_classifier.py::test_crash_names_its_cause_first_in_the_evidence_and_in_the_message",),
         (UNIT + "test_classifier.py::test_ambiguous_sglang_unexpected_error_line_alone_is_not_fatal",
          LIVE + "test_rule_controls.py::test_a_healthy_start_that_logs_lines_like_a_crash_ends_ready",
          UNIT + "test_classifier.py::test_a_crash_of_an_earlier_run_in_a_file_tail_is_cleared_by_this_runs_start_line",
          LIVE + "test_rule_controls.py::test_an_earlier_runs_crash_in_an_appended_log_ends_ready",
          LIVE + "test_failure_notify_guest.py::test_a_restarted_runs_late_last_words_do_not_fail_the_new_runs_wait"),
         fatal_log_line),
    Rule("unit_not_found", FAILED, "unit mode: systemd knows no such unit", "failed: unit U does not exist",
         (UNIT + "test_rules.py::test_a_unit_that_does_not_exist_fails_at_once",),
         (UNIT + "test_classifier.py::test_unit_not_started_yet_is_not_started_and_not_failed",),
         unit_not_found),
    Rule("unit_restarted", FAILED, "unit mode: NRestarts up, a new MainPID, or SubState auto-restart",
         "failed: unit U restarted N time(s) during the wait (...): its server crashed[: <its exception, from the log or "
         "the launcher's record>]",
         (UNIT + "test_classifier.py::test_unit_mode_crash_that_exits_0_or_restarts_is_failed",
          UNIT + "test_crash_loop.py::test_a_restart_seen_before_the_runs_last_lines_reach_the_journal_names_what_the_"
          "launcher_recorded"),
         (UNIT + "test_probe.py::test_a_wait_begun_during_a_restarts_drain_starts_its_story_at_the_next_run",
          LIVE + "test_failure_notify_guest.py::test_a_wait_begun_during_a_restarts_drain_judges_the_next_run"),
         unit_restarted),
    Rule("unit_ended", FAILED, "unit mode: the unit failed, or stopped after it was seen running",
         "failed: unit U failed (...) / stopped N s into the wait (...); a crash can exit 0[: <its exception>]",
         (UNIT + "test_classifier.py::test_unit_mode_crash_that_exits_0_or_restarts_is_failed",),
         (UNIT + "test_classifier.py::test_unit_not_started_yet_is_not_started_and_not_failed",
          LIVE + "test_failure_notify_guest.py::test_a_wait_begun_during_a_restarts_drain_judges_the_next_run"),
         unit_ended),
    Rule("process_exited", FAILED, "pid mode: the watched process is gone (with log_path: also gone before the wait "
         "began, while no other process serves the URL's port)",
         "failed: process P exited N s into the wait, in phase X: <its exception> / had exited before the wait began: ...",
         (UNIT + "test_classifier.py::test_crash_process_gone_is_failed_on_the_first_poll_with_the_exception_as_evidence",
          LIVE + "test_module_ansible.py::test_a_wait_begun_after_its_server_died_fails_at_once_quoting_the_log"),
         (UNIT + "test_rules.py::test_children_that_come_and_go_while_the_watched_process_lives_are_no_exit",
          LIVE + "test_rule_controls.py::test_children_that_exit_while_the_watched_process_lives_end_ready",
          LIVE + "test_module_ansible.py::test_a_stale_pid_of_a_server_that_serves_again_is_refused_never_failed"),
         process_exited),
    Rule("rank_died", FAILED, "a rank (a process the engine titled as one, not by fork) gone by a signal or a "
         "non-zero exit, the server up; one more look for the engine's own word",
         "failed: rank TP2 (pid P) died (killed by signal 9 (SIGKILL)); still alive: ...: they wait for it",
         (UNIT + "test_classifier_arrivals.py::test_a_rank_killed_without_a_word_fails_one_look_later_when_the_engine_says_nothing",
          LIVE + "test_arrivals.py::test_a_rank_that_dies_is_named_with_its_exit_and_the_ranks_still_waiting"),
         (UNIT + "test_rules.py::test_a_forked_child_with_its_ranks_title_that_is_killed_is_no_rank",
          UNIT + "test_rules.py::test_a_helper_its_rank_sigterms_on_purpose_is_no_rank_death",
          LIVE + "test_rank_churn.py::test_a_helper_its_parent_sigterms_on_purpose_ends_ready",
          LIVE + "test_rank_churn.py::test_a_helper_forked_by_a_server_started_with_node_rank_0_ends_ready"),
         rank_died),
    Rule("rank_gone_quiet", FAILED, "a rank that exited 0 or was reaped unseen, and no progress of any kind from its "
         "end on for min(%d s, stall_timeout); once the start moved after the end, never" % RANK_GONE_QUIET,
         "failed: rank TP1 (pid P) is gone (exit status unknown: reaped) at +N s, and nothing has moved since ...",
         (UNIT + "test_classifier_arrivals.py::test_a_reaped_rank_with_its_siblings_parked_fails_after_the_quiet_bound",
          LIVE + "test_rank_churn.py::test_a_rank_killed_and_reaped_at_once_with_its_siblings_parked_fails_within_the_quiet_bound"),
         (UNIT + "test_rules.py::test_a_loader_chain_that_exits_0_before_the_server_comes_up_is_ready",
          UNIT + "test_rules.py::test_compile_worker_churn_is_ready",
          LIVE + "test_rank_churn.py::test_a_loader_chain_that_exits_0_before_the_server_comes_up_ends_ready",
          LIVE + "test_rank_churn.py::test_compile_worker_churn_ends_ready"),
         rank_gone_quiet),
    Rule("peer_left", FAILED, "multi-node: another node's connections to the dist-init port closed",
         "failed: node N (...) left the group at +N s: ...; restart every node of the group together",
         (UNIT + "test_classifier_peers.py::test_a_node_whose_connections_close_during_the_load_fails_the_start_naming_it",),
         (UNIT + "test_classifier_peers.py::test_a_node_joining_is_progress_and_extra_connections_coming_and_going_are_not_leaving",
          LIVE + "test_rule_controls.py::test_extra_connections_to_the_dist_init_port_coming_and_going_end_ready"),
         peer_left),
    Rule("vllm_engine_dead", FAILED, "vLLM: /health answers 503 (its engine core is dead)",
         "failed: vLLM's /health answers 503: its engine core is dead[: <the exception in its log>]",
         (UNIT + "test_rules.py::test_vllms_health_503_fails_the_wait",
          UNIT + "test_rules.py::test_vllms_health_503_names_the_exception_its_core_died_of"),
         (UNIT + "test_rules.py::test_an_sglang_health_503_while_it_warms_up_is_no_failure",
          LIVE + "test_rule_controls.py::test_sglangs_health_503_while_it_warms_up_ends_ready"),
         vllm_engine_dead),
    Rule("port_held", FAILED, "the URL's local port held by a process outside the server's tree",
         "failed: port N is held by another process (pid P, comm), not by the server's processes [...]",
         (UNIT + "test_classifier.py::test_port_held_by_another_process_is_named_also_when_the_server_died_of_it",),
         (UNIT + "test_rules.py::test_a_port_held_by_the_servers_own_child_is_no_foreign_holder",
          LIVE + "test_rule_controls.py::test_a_port_served_by_the_servers_own_worker_ends_ready"),
         port_held),
)
HANG_RULES = (
    Rule("stalled", STALLED, "no progress on any signal for stall_timeout (spinning CPU does not count)",
         "stalled: no progress for N s in phase X (last progress: ... at +N s; ...); a server that had been "
         "ready: stalled: no progress for N s after the engine logged that it was ready: it answers nothing (...)",
         (UNIT + "test_classifier.py::test_hang_is_stalled_exactly_at_stall_timeout_not_a_poll_earlier",
          LIVE + "test_arrivals.py::test_a_download_whose_server_stops_sending_is_stalled_waiting_on_the_network"),
         (UNIT + "test_classifier.py::test_vllm_cpu_start_17_s_silence_after_loading_is_not_stalled",
          LIVE + "test_arrivals.py::test_python_at_work_on_one_hot_line_longer_than_stall_timeout_is_not_a_busy_wait",
          LIVE + "test_arrivals.py::test_a_hub_download_longer_than_stall_timeout_is_watched_to_ready"),
         stalled),
    Rule("timeout", TIMEOUT, "the overall deadline passed while the start still made progress",
         "timeout: not ready after N s; in phase X since +N s, last progress N s ago (...)",
         (UNIT + "test_rules.py::test_a_start_still_working_at_the_deadline_times_out",),
         (UNIT + "test_rules.py::test_a_start_ready_a_look_before_the_deadline_is_ready",),
         timeout),
)
RULES = FAILURE_RULES + HANG_RULES


def judge(rules, look):
    """The first rule of `rules` that ends the wait at this look, its verdict named after it; else None."""
    for rule in rules:
        verdict = rule.check(look)
        if verdict is HOLD:
            return None
        if verdict is not None:
            verdict.rule = rule.name
            return verdict
    return None


def rank_notes(state):
    """The ranks that ended without proving a death, for a verdict's evidence while the start goes on."""
    return ["%s at +%s; the start went on" % (wording.rank_gone(g), wording.secs(g.t))
            for g in state.ranks_gone if not g.hard()]
