"""A stored message fits its cap and keeps what explains the failure: a
device compiler's message starts with the generated source and ends with the
compiler's own lines."""

from __future__ import annotations

from runners.harness.result import MESSAGE_CAP, cap_message

SOURCE = "\n".join(f"  acc[{i}] = acc[{i}] + a_tile[{i} * 64];" for i in range(2000))
COMPILER_MESSAGE = (
    f"RuntimeError: #include <cuda.h>\n{SOURCE}\n\n"
    "Compilation error:\n"
    "nvcc fatal   : Unsupported gpu architecture 'sm_10'\n\n"
    "Command: <path>/nvcc --cubin -arch=sm_10 -o <path>/k.cubin <path>/k.cu"
)


def test_a_short_message_is_kept_whole():
    assert cap_message("ValueError: x\nline 2", MESSAGE_CAP) == "ValueError: x\nline 2"


def test_a_long_compiler_message_keeps_the_compilers_lines_within_the_cap():
    capped = cap_message(COMPILER_MESSAGE, MESSAGE_CAP)
    assert len(COMPILER_MESSAGE.encode()) > 8 * MESSAGE_CAP
    assert len(capped.encode()) <= MESSAGE_CAP
    lines = capped.splitlines()
    assert lines[0] == "RuntimeError: #include <cuda.h>"
    assert lines[1].endswith(" lines cut]")
    assert lines[-4:] == COMPILER_MESSAGE.splitlines()[-4:]


def test_error_lines_amid_a_long_message_are_kept():
    lines = [f"  note {i}: in generated code" for i in range(3000)]
    lines[1000] = "k.cu(1000): error: identifier tm_acc is undefined"
    capped = cap_message("\n".join(lines), 4096)
    assert len(capped.encode()) <= 4096
    assert "k.cu(1000): error: identifier tm_acc is undefined" in capped
    assert capped.splitlines()[-1] == lines[-1]


def test_one_huge_line_is_cut_not_dropped():
    capped = cap_message("ValueError: " + "é" * 20_000, MESSAGE_CAP)
    assert capped.startswith("ValueError: é") and capped.endswith(" [cut]")
    assert len(capped.encode()) <= MESSAGE_CAP
