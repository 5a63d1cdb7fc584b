"""Stored messages keep shapes, dtype, target and pass names, and lose paths,
environment values and tensor data; equal errors share a signature."""

from __future__ import annotations

from runners.harness.sanitize import error_signature, normalize, sanitize

ENV = {"TM_CANARY_SECRET": "s3cr3t-value-123", "SHORT": "abc", "HOME": "/home/alice"}


def test_it_keeps_package_relative_paths_and_drops_install_and_home_paths():
    text = (
        "File /opt/venv/lib/python3.11/site-packages/tilelang/jit/kernel.py, "
        "line 3, from /home/alice/work/kernel.py and /tmp/tm-harness-x1y2/k.py"
    )
    clean = sanitize(text, environ={})
    assert "tilelang/jit/kernel.py" in clean
    assert "/opt/venv" not in clean and "site-packages" not in clean
    assert "alice" not in clean and "tm-harness-x1y2" not in clean
    assert "k.py" in clean


def test_it_makes_repository_paths_relative_and_keeps_toolchain_sources():
    text = "at /srv/tm/runners/kernels/gemm.py and /project/src/transform/x.cc:12"
    clean = sanitize(text, roots=["/srv/tm"], environ={})
    assert clean == "at runners/kernels/gemm.py and src/transform/x.cc:12"


def test_it_redacts_environment_values_but_not_short_ones():
    clean = sanitize("token s3cr3t-value-123 in abc", environ=ENV)
    assert "s3cr3t-value-123" not in clean
    assert "<redacted>" in clean and "abc" in clean


def test_it_drops_tensor_contents_and_keeps_shapes_dtype_target_and_passes():
    text = (
        "LayoutInference failed for float16 (128, 64) on "
        '{"kind": "cuda", "arch": "sm_90a"}: got tensor([[0.1250, -1.5000],\n'
        "        [2.0000, 3.0000]], dtype=torch.float16) and [[1.5, 2.5], [3.5, 4.5]] "
        "at index [3, 4]"
    )
    clean = sanitize(text, environ={})
    assert "0.1250" not in clean and "1.5" not in clean and "3.5" not in clean
    assert "tensor(<data>)" in clean and "[<data>]" in clean
    assert "LayoutInference" in clean and "float16" in clean and "(128, 64)" in clean
    assert '"arch": "sm_90a"' in clean and "[3, 4]" in clean


def test_urls_and_division_are_not_paths():
    text = "see https://github.com/tile-ai/tilelang; x / y and a[i]/b"
    assert sanitize(text, environ={}) == text


def test_equal_errors_at_other_shapes_addresses_and_lines_share_a_signature():
    a = "Check failed: extent 128 at 0x7ffd1234 (kernel.py:41:3), line 41"
    b = "Check failed: extent 48 at 0x55aa0000 (kernel.py:7:1), line 7"
    assert normalize(a) == normalize(b)
    assert error_signature(a) == error_signature(b)
    assert len(error_signature(a)) == 16


def test_different_errors_and_dtypes_do_not_group():
    base = error_signature("cannot vectorize float16 load")
    assert base != error_signature("cannot vectorize bfloat16 load")
    assert base != error_signature("layout for fragment F can not be inferred")


def test_temp_directories_of_two_runs_leave_one_message_and_signature():
    runs = [
        "/tmp/tmpAAAA/home/tmp/tmp8ru55hm0/x: undefined symbol f",
        "/tmp/tmpBBBB/home/tmp/tmpzzzz/x: undefined symbol f",
    ]
    clean = [sanitize(text, environ={}) for text in runs]
    assert clean[0] == clean[1] == "<path>/x: undefined symbol f"
    assert error_signature(clean[0]) == error_signature(clean[1])
    assert error_signature(clean[0]) != error_signature(
        sanitize(runs[0].replace("undefined symbol", "no such file"), environ={})
    )


def test_a_sandbox_path_keeps_its_file_name_only():
    sandbox = "/srv/sandbox/tm-harness-3k2j1h0g"
    text = (
        f"-o {sandbox}/home/tmp/tmp8ru55hm0/tvm_kernels.cubin "
        f"{sandbox}/home/tmp/tmp8ru55hm0/include/k.h /srv/cache/kernels/ab12/lib.so"
    )
    clean = sanitize(text, private=[sandbox, "/srv/cache"], environ={})
    assert clean == "-o <path>/tvm_kernels.cubin <path>/k.h <path>/lib.so"


def test_random_temp_names_are_replaced_where_a_path_keeps_its_directories():
    text = "/srv/tm/var/cache/tmp/tmp8ru55hm0/lib.so and /tmp/tmpk_3ab9zq.cubin"
    clean = sanitize(text, roots=["/srv/tm"], environ={})
    assert clean == "var/cache/tmp/tmpXXXXXXXX/lib.so and <path>/tmpXXXXXXXX.cubin"
