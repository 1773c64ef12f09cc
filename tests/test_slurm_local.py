"""tools/slurm_local.sh, the Slurm lane's private Slurm, on a host that already has a cluster's Slurm: each test runs
the script as a user types it, as root, in private mount, PID and network namespaces (unshare) where /etc/slurm and
/etc/munge are tmpfs holding a cluster's files, /proc shows the namespace's processes only and lo is its own. So
the daemons of another Slurm (the lane's own, say) are neither seen nor touched, and whatever the test starts ends
with the namespace. The refusals need no Slurm installed; the start and stop is the Slurm lane's (make test-slurm)."""
import os
import shutil
import subprocess

import pytest

from conftest import ONCE, PY, ROOT, assert_one_line

pytestmark = [ONCE, pytest.mark.timeout(300)]

SCRIPT = os.path.join(ROOT, "tools", "slurm_local.sh")
CLUSTER_CONF = (b"# the cluster's own configuration\nClusterName=production\nSlurmctldHost=head01\n"
                b"AuthType=auth/munge\nNodeName=cn[001-064] CPUs=128 State=UNKNOWN\n"
                b"PartitionName=batch Nodes=cn[001-064] Default=YES State=UP\n")
CLUSTER_KEY = bytes(range(256)) * 4


def _namespaces_or_skip():
    if os.geteuid() != 0:
        pytest.skip("needs root: the test mounts over /etc/slurm in a private namespace and the script runs daemons")
    for tool in ("unshare", "ip"):
        if not shutil.which(tool):
            pytest.skip("{} is missing (util-linux, iproute2): the test runs the script in namespaces".format(tool))
    probe = subprocess.run(["unshare", "--mount", "--pid", "--net", "--fork", "--mount-proc", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("no private namespaces here (unshare: {})".format(probe.stderr.strip()))
    for folder in ("/etc/slurm", "/etc/munge"):
        if not os.path.isdir(folder):
            pytest.skip("no {} to stand for a cluster's (Debian's slurm-wlm and munge create it)".format(folder))


def in_namespaces(tmp_path, body, timeout=240):
    """Runs bash ``body`` in the namespaces (cwd the repository; $T is tmp_path, where the cluster's files and
    the outputs are). /etc/slurm and /etc/munge are copied back to $T/after-slurm and $T/after-munge at the end."""
    cluster = tmp_path / "cluster"
    (cluster / "slurm").mkdir(parents=True)
    (cluster / "munge").mkdir()
    (cluster / "slurm" / "slurm.conf").write_bytes(CLUSTER_CONF)
    (cluster / "munge" / "munge.key").write_bytes(CLUSTER_KEY)
    os.chmod(str(cluster / "munge" / "munge.key"), 0o400)
    # lo gets an address besides 127.0.0.1: Slurm's daemons resolve their listening address with getaddrinfo's
    # AI_ADDRCONFIG, which finds none on a host with loopback addresses only
    script = "\n".join([
        "set -u", "ip link set lo up", "ip addr add 10.254.0.1/32 dev lo",
        "for d in slurm munge; do mount -t tmpfs tmpfs /etc/$d && cp -a \"$T\"/cluster/$d/. /etc/$d/; done",
        "( " + body + " )",
        "cp -a /etc/slurm \"$T\"/after-slurm; cp -a /etc/munge \"$T\"/after-munge"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(T=str(tmp_path), SLURM_LOCAL_STATE=str(tmp_path / "s"))
    return subprocess.run(["unshare", "--mount", "--pid", "--net", "--fork", "--kill-child", "--mount-proc",
                           "--propagation", "private", "bash", "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def tree(folder):
    """{relative path: (mode, bytes)} of every file and folder under ``folder``."""
    out = {}
    for here, dirs, files in os.walk(str(folder)):
        for name in dirs + files:
            path = os.path.join(here, name)
            data = open(path, "rb").read() if os.path.isfile(path) else None
            out[os.path.relpath(path, str(folder))] = (os.stat(path).st_mode, data)
    return out


def assert_cluster_files_untouched(tmp_path):
    for d in ("slurm", "munge"):
        assert tree(tmp_path / ("after-" + d)) == tree(tmp_path / "cluster" / d), d
    assert (tmp_path / "after-slurm" / "slurm.conf").read_bytes() == CLUSTER_CONF


def fake_daemon(tmp_path, name):
    """An executable named ``name`` (a copy of sleep): its process's name is ``name``, as a daemon's is."""
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    shutil.copy(shutil.which("sleep"), str(path))
    return str(path)


def read(tmp_path, name):
    return (tmp_path / name).read_text()


@pytest.mark.parametrize("daemon", ["slurmctld", "slurmd"])
def test_it_refuses_beside_a_slurm_daemon_it_did_not_start_and_writes_nothing(tmp_path, daemon):
    _namespaces_or_skip()
    fake = fake_daemon(tmp_path, daemon)
    proc = in_namespaces(tmp_path, '{} 300 & echo $! > "$T"/fake.pid\n'
                                   'tools/slurm_local.sh > "$T"/out 2> "$T"/err; echo $? > "$T"/rc'.format(fake))
    assert proc.returncode == 0, proc.stderr
    fake_pid = read(tmp_path, "fake.pid").strip()
    assert_one_line(int(read(tmp_path, "rc")), read(tmp_path, "err"), "did not start runs here",
                    "{} (pid {})".format(daemon, fake_pid), out=read(tmp_path, "out"))
    assert read(tmp_path, "out") == ""
    assert not (tmp_path / "s").exists()  # no state folder, no slurm.conf, no munge key
    assert_cluster_files_untouched(tmp_path)


def test_it_refuses_where_slurms_port_already_answers(tmp_path):
    """A controller this host's /proc does not show (another container's, on the same network) still holds
    Slurm's port: the script refuses rather than start a second Slurm beside it."""
    _namespaces_or_skip()
    listen = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 6817)); s.listen(8); "
              "open(sys.argv[1], 'w').write('up'); time.sleep(300)")
    proc = in_namespaces(tmp_path, '"{}" -c "{}" "$T"/up &\n'
                                   'until [ -s "$T"/up ]; do sleep 0.05; done\n'
                                   'tools/slurm_local.sh > "$T"/out 2> "$T"/err; echo $? > "$T"/rc'.format(PY, listen))
    assert proc.returncode == 0, proc.stderr
    assert_one_line(int(read(tmp_path, "rc")), read(tmp_path, "err"), "port 6817 on this host already answers",
                    out=read(tmp_path, "out"))
    assert not (tmp_path / "s").exists()
    assert_cluster_files_untouched(tmp_path)


@pytest.mark.slurm
def test_start_and_stop_keep_to_their_folder_and_leave_the_clusters_files_and_munged_alone(tmp_path):
    """Start, srun -n 2 hostname with the printed SLURM_CONF, start again, stop: the cluster's slurm.conf and
    munge.key are byte for byte as they were, a host munged running before is still running after stop, the
    script's daemons are gone."""
    _namespaces_or_skip()
    for tool in ("slurmctld", "slurmd", "munged", "srun"):
        assert shutil.which(tool), "{} is missing: run the lane with make test-slurm (it installs Slurm)".format(tool)
    host_munged = fake_daemon(tmp_path, "munged")
    proc = in_namespaces(tmp_path, "\n".join([
        '{} 300 & echo $! > "$T"/host-munged.pid'.format(host_munged),
        'tools/slurm_local.sh > "$T"/start.out 2> "$T"/start.err; echo $? > "$T"/start.rc',
        'eval "$(cat "$T"/start.out)"',
        'srun -n 2 hostname > "$T"/srun.out 2>&1; echo $? > "$T"/srun.rc',
        'cat "$SLURM_LOCAL_STATE"/*.pid > "$T"/pids',
        'tools/slurm_local.sh > "$T"/again.out 2> "$T"/again.err; echo $? > "$T"/again.rc',
        'cat "$SLURM_LOCAL_STATE"/*.pid > "$T"/pids-again',
        'tools/slurm_local.sh stop > "$T"/stop.out 2>&1; echo $? > "$T"/stop.rc',
        'pgrep -x "slurmctld|slurmd|munged" > "$T"/left || true']))
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / "s"
    assert read(tmp_path, "start.rc").strip() == "0", (read(tmp_path, "start.err"), read(tmp_path, "start.out"))
    start = read(tmp_path, "start.out").splitlines()
    assert start[0].startswith("# slurm_local: node ") and " up (" in start[0]
    assert start[-1] == "export SLURM_CONF={}/slurm.conf".format(state)
    assert read(tmp_path, "start.err") == ""
    assert (state / "env").read_text().strip() == start[-1]
    conf = (state / "slurm.conf").read_text()
    assert "AuthInfo=socket={}/munge/munge.socket".format(state) in conf and "StateSaveLocation={}/ctld".format(
        state) in conf
    assert read(tmp_path, "srun.rc").strip() == "0", read(tmp_path, "srun.out")
    assert read(tmp_path, "srun.out").split() == [os.uname()[1]] * 2
    # started again while running: its own daemons are found as its own (their forks too), and kept
    assert read(tmp_path, "again.rc").strip() == "0", read(tmp_path, "again.err")
    assert read(tmp_path, "again.out") == read(tmp_path, "start.out")
    assert read(tmp_path, "pids-again") == read(tmp_path, "pids") and len(read(tmp_path, "pids").split()) == 3
    assert read(tmp_path, "stop.rc").strip() == "0", read(tmp_path, "stop.out")
    # what is left after stop: the host's munged only
    assert read(tmp_path, "left").split() == [read(tmp_path, "host-munged.pid").strip()]
    assert not any(p.name.endswith(".pid") for p in state.iterdir())
    assert_cluster_files_untouched(tmp_path)
