"""The unit the model_service role renders honours the maintenance hold: a launcher unit does not restart
on the launcher's held status (8), and the launcher is told the hold directory only when it is not its
own default (so that units of hosts without holds stay as they were)."""
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.exit_codes import EXIT_CRASH_LOOP, EXIT_HELD, EXIT_USAGE

from tests.unit.test_model_service_render import directive, exec_start, make_model, run_play


def test_launcher_units_do_not_restart_a_held_engine_and_plain_units_are_unchanged(tmp_path):
    model = str(tmp_path / "models" / "k26")
    make_model(model)
    common = {"model_service_engine": "sglang", "model_service_model_path": model}
    hosts = {
        "notify": dict(common, model_service_unit="sglang-a", model_service_launcher=True),
        "elsewhere": dict(common, model_service_unit="sglang-b", model_service_launcher=True,
                          model_service_hold_dir="/srv/modelwake/holds"),
        "plain": dict(common, model_service_unit="sglang-c", model_service_launcher=False),
    }
    proc, root = run_play(tmp_path, hosts)
    assert proc.returncode == 0, proc.stdout
    units = dict((host, (root / host / "unit.service").read_text()) for host in hosts)
    assert directive(units["notify"], "RestartPreventExitStatus") == ["%d %d %d" % (EXIT_USAGE, EXIT_CRASH_LOOP, EXIT_HELD)]
    assert "--hold-dir" not in exec_start(units["notify"])
    assert " --hold-dir /srv/modelwake/holds " in exec_start(units["elsewhere"])
    # Without the launcher nothing exits 7 or 8: systemd restarts a plain unit as before.
    assert directive(units["plain"], "RestartPreventExitStatus") == ["%d" % EXIT_USAGE]
