import pytest

from dsnb.config import ConfigError
from dsnb.run import check_nvme_path, check_nvme_space


def test_nvme_path_checks(tmp_path):
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if AsyncIOBuilder().is_compatible(verbose=False):  # setup.sh installs libaio where it can
        check_nvme_path(str(tmp_path))
    else:
        with pytest.raises(ConfigError, match="apt-get install libaio-dev"):
            check_nvme_path(str(tmp_path))
    with pytest.raises(ConfigError, match="does not exist"):
        check_nvme_path(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="is not writable"):
        check_nvme_path("/proc")


def test_nvme_space_is_checked_against_what_the_run_offloads(tmp_path):
    check_nvme_space(str(tmp_path), needed_mb=1)
    with pytest.raises(ConfigError, match=r"GB free but this run offloads about .* set nvme_path to a larger disk"):
        check_nvme_space(str(tmp_path), needed_mb=2**40)
