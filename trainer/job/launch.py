"""The placement settled for the device kind at plan time (``settle``) and the checks that need no process group:
backend, rendezvous scheme, device list, port. Launch modes, batch and LR rules: docs/DESIGN.md."""
import dataclasses
import os
import socket

from trainer.job import clusters, rendezvous
from trainer.errors import UsageError


def settle(section, kind, batch_size, environ=None):
    """(The config's launch ``section`` decided for ``kind`` before any process starts, notes); ``environ``: the
    environment the messages name. A spawned rank's device is decided where it starts."""
    from trainer import device as devmod  # the device layer imports torch: only where a kind or count is needed
    check_devices(section, kind, environ)
    world = section.world_size
    if section.mode == "spawn":  # one process per listed device, else per visible one
        section = dataclasses.replace(section, device_list=section.device_list or tuple(
            range(devmod.Device.of(kind).count())))
        world = section.nodes * len(section.device_list)
    if batch_size % world:
        raise UsageError("--batch-size {} (global) does not divide over {} processes; use a multiple of {}".format(
            batch_size, world, world))
    backend, notes = section.dist_backend, ()
    owner = devmod.Device.backend_owner(backend)  # the guides' hccl on a GPU or CPU, nccl off CUDA: this device's own
    if owner is not None and owner != kind:
        backend = devmod.Device.of(kind).dist_backend
        notes = ("--dist-backend {} is the {} collective library; this run is on {}: using {}".format(
            section.dist_backend, owner.upper(), kind.upper(), backend),)
    section = dataclasses.replace(section, device=kind, dist_backend=backend)
    notes += check_launch(section, kind)
    rendezvous.check_master(section)
    if section.mode != "spawn":
        section = dataclasses.replace(section, device_index=device_index(section))
    return section, notes


def check_launch(section, kind):
    """Before any process starts: the rendezvous and the device count suit ``kind``. Returns notes."""
    from trainer import device as devmod
    kind_cls = devmod.Device.of(kind)
    if section.world_size != 1 and not section.dist_url.startswith(kind_cls.rendezvous_schemes):
        raise UsageError("--dist-url {}: {} processes start their group from environment variables only "
                         "(init_method env://, as the Ascend guide says); drop --dist-url and give the master as "
                         "--addr HOST --port PORT".format(section.dist_url, kind.upper()))
    allowed = kind_cls.supported_devices_per_node
    per_node = section.procs_per_node or (len(section.device_list) if section.device_list else kind_cls.count())
    if allowed and section.world_size != 1 and per_node not in allowed:
        return ("{} device(s) per node: the Ascend guide supports only {} {}s per node for collective "
                "communication; expect the collectives to fail".format(per_node, "/".join(map(str, allowed)),
                                                                        kind.upper()),)
    return ()


def device_index(section):
    """This process's device: its slot's entry of --device-list (or of the rank table's), or --gpu, or its slot."""
    slot = section.local_rank or 0
    if section.device_list:
        if slot >= len(section.device_list):
            raise UsageError("local rank {} has no entry in --device-list {} ({} entries)".format(
                slot, ",".join(map(str, section.device_list)), len(section.device_list)))
        return section.device_list[slot]
    return section.device_index if section.device_index is not None else slot


def check_devices(section, kind, environ=None):
    """Before any process starts: the device settings suit the kind, the device list exists on this machine."""
    from trainer import device as devmod
    environ = os.environ if environ is None else environ
    kind_cls = devmod.Device.of(kind)
    problem = kind_cls.settings_problem(section)
    if problem:
        raise UsageError(problem)
    ids = section.device_list
    if not ids or not kind_cls.numbered:
        return
    problem = kind_cls.visible_devices_problem()
    if problem:
        raise UsageError(problem)
    visible = kind_cls.count()
    env = kind_cls.visible_devices_env
    bad = [i for i in ids if i >= visible]
    if bad:
        table = environ.get("RANK_TABLE_FILE")
        listed = table and section.mode == "process" and bad[0] in _table_ids(environ)
        raise UsageError("{} asks for {} device {} but {} visible (ids 0-{}){}".format(
            "RANK_TABLE_FILE '{}'".format(table) if listed else "--device-list", kind, bad[0], visible, visible - 1,
            " under {}={}".format(env, environ[env]) if env and environ.get(env) else ""))


def _table_ids(environ):
    """This host's device ids in RANK_TABLE_FILE (none where it does not list this host by address)."""
    try:
        place = clusters.host_ranks(environ, rendezvous.is_local_address)
    except UsageError:
        return ()
    return place["devices"] if place else ()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def check_port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            raise UsageError("port {} is in use: pass --port N with a free port, or --port 0 to pick one".format(port))
