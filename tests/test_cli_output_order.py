"""What a command prints where the user looks: notices before the progress bars, the results table at the end."""

import pytest

from fsattn_diffusers import backends, cli

SMALL = ["--steps", "1", "--frames", "1", "--height", "32", "--width", "32", "--no-warmup", "--no-lpips"]


# pyproject.toml ignores this notice for the suite; here it is what the test reads, so it is shown.
@pytest.mark.filterwarnings("default:fsattn. using the 'emulator' backend")
def test_sweep_says_the_emulator_is_slow_before_the_bars_and_ends_with_the_table(tmp_path, capsys):
    backends._WARNED.discard("slow:emulator")
    rc = cli.main(["sweep", "--prompt", "a cat", "--policies", "mxfp8", "--out", str(tmp_path / "o"), *SMALL])
    out, err = capsys.readouterr()
    print(out, err)
    assert rc == 0
    notice = err.index("fsattn sweep: warning: using the 'emulator' backend")
    assert "%|" in err and notice < err.index("%|")  # before the first progress bar
    table = out.strip().splitlines()[-4:-1]  # header, bf16, mxfp8; then the line naming report.md
    assert table[0].split() == ["policy", "PSNR", "dB", "SSIM", "LPIPS", "s/step", "failed"]
    assert table[1].split()[:2] == ["bf16", "inf"] and table[1].split()[3] == "unavailable"
    assert table[2].split()[0] == "mxfp8" and float(table[2].split()[1]) > 0 and table[2].split()[-1] == "0"
