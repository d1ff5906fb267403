"""The native core's ctypes declarations (hgemm/_native_decls.py) against client/c/hgemm.h: the
committed module is what gen_native_decls.py makes of the header, a changed header makes
`--check` fail, a declaration the generator cannot read stops it, nothing exported is left out,
and the structs' ctypes layout is the C compiler's."""
import ctypes
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from hgemm import _native_decls as decls

HERE = pathlib.Path(__file__).resolve().parent
GEN = HERE.parent / "gen_native_decls.py"
HEADER = HERE.parents[2] / "client" / "c" / "hgemm.h"

pytestmark = pytest.mark.skipif(not HEADER.exists(), reason="not in a clone of the repository")


def run_gen(*args):
    return subprocess.run([sys.executable, str(GEN), *map(str, args)], capture_output=True,
                          text=True)


def changed_header(tmp_path, old: str, new: str) -> pathlib.Path:
    """A copy of hgemm.h with `old` (which must occur once) replaced by `new`."""
    text = HEADER.read_text()
    assert text.count(old) == 1, old
    path = tmp_path / "hgemm.h"
    path.write_text(text.replace(old, new))
    return path


def test_committed_decls_match_the_header():
    r = run_gen("--check")
    assert r.returncode == 0, r.stderr


def test_check_fails_when_an_argument_type_changes(tmp_path):
    header = changed_header(tmp_path, "hgemm_client_options_set_chunk_bytes(hgemm_client_options_t"
                            "* options,\n                                                       "
                            "int64_t chunk_bytes)",
                            "hgemm_client_options_set_chunk_bytes(hgemm_client_options_t* options,"
                            " int32_t chunk_bytes)")
    r = run_gen("--check", "--header", header)
    assert r.returncode == 1
    assert "differs from hgemm.h" in r.stderr
    assert '+    "hgemm_client_options_set_chunk_bytes": (None, (c_void_p, c_int32)),' in r.stderr
    # Regenerated from it, the module has the new signature (and --check passes against it).
    out = tmp_path / "decls.py"
    assert run_gen("--header", header, "--out", out).returncode == 0
    assert run_gen("--check", "--header", header, "--out", out).returncode == 0


def test_check_fails_when_a_struct_field_changes(tmp_path):
    header = changed_header(tmp_path, "  uint32_t in_use;     /* GEMMs using it now */",
                            "  uint64_t in_use;")
    r = run_gen("--check", "--header", header)
    assert r.returncode == 1
    assert '+        ("in_use", c_uint64),' in r.stderr


END = "#ifdef __cplusplus\n} /* extern \"C\" */"


@pytest.mark.parametrize("declaration, why", [
    ("HGEMM_EXPORT long double hgemm_x(void);", "cannot pass 'long double' by value"),
    ("HGEMM_EXPORT void hgemm_x(hgemm_matrix_info_t info);", "by value"),
    ("HGEMM_EXPORT void hgemm_x(int values[4]);", "an array parameter"),
    ("HGEMM_EXPORT void hgemm_x(void (*fn)(int));", "not a declaration this generator reads"),
    ("HGEMM_EXPORT void hgemm_x(int**);", "expected a type and a name"),
    ("HGEMM_EXPORT void hgemm_x();", "an empty parameter list"),
    ("HGEMM_EXPORT void hgemm_x(hgemm_unknown_t* u);", "no ctypes mapping"),
    ("typedef union hgemm_u { int a; double b; } hgemm_u;", "not a declaration"),
    ("enum hgemm_e { HGEMM_E = 1 };", "not a declaration"),
    ("enum { HGEMM_E = 1 << 2 };", "NAME = <integer>"),
    ("#define HGEMM_MAX_DIM (1u << 20)", "unsupported preprocessor directive"),
    ("#include <stdbool.h>", "unsupported preprocessor directive"),
    ("void hgemm_x(void);", "not a declaration"),
    ("HGEMM_EXPORT void hgemm_abi_version(void);", "declared twice"),
])
def test_a_declaration_it_cannot_read_stops_it(tmp_path, declaration, why):
    header = changed_header(tmp_path, END, declaration + "\n\n" + END)
    line = header.read_text().split("\n").index(declaration) + 1
    for args in (["--check"], ["--out", tmp_path / "decls.py"]):
        r = run_gen(*args, "--header", header)
        assert r.returncode != 0
        assert why in r.stderr, r.stderr
        if why != "declared twice":
            assert f"line {line}:" in r.stderr, r.stderr
    assert not (tmp_path / "decls.py").exists()


def test_every_exported_function_is_declared():
    # Independently of the generator's parser: every name HGEMM_EXPORT declares.
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    exported = re.findall(r"^HGEMM_EXPORT\b[^;(]*?\b(hgemm_\w+)\s*\(", text, flags=re.M)
    assert len(exported) > 100
    assert list(decls.FUNCTIONS) == exported


def test_constants_are_the_headers():
    text = HEADER.read_text()
    assert decls.HGEMM_ABI_VERSION == int(re.search(r"#define HGEMM_ABI_VERSION (\d+)", text)[1])
    assert decls.HGEMM_ABI_REVISION == int(re.search(r"#define HGEMM_ABI_REVISION (\d+)",
                                                     text)[1])
    for name, value in re.findall(r"^\s*(HGEMM_[A-Z0-9_]+) = (\d+)", text, flags=re.M):
        assert getattr(decls, name) == int(value), name


def structs():
    """The generated module's Structures, in its order."""
    return [v for v in vars(decls).values() if isinstance(v, type)
            and issubclass(v, ctypes.Structure) and v is not ctypes.Structure]


def test_struct_layouts_are_the_c_compilers(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    defined = re.findall(r"^typedef struct (\w+) \{", HEADER.read_text(), flags=re.M)
    assert [s.__name__ for s in structs()] == defined
    # A program printing what the compiler makes of each struct: its size and field offsets.
    lines = ["#include <stddef.h>", "#include <stdio.h>", f'#include "{HEADER}"',
             "int main(void) {"]
    ours = []
    for struct in structs():
        name = struct.__name__
        lines.append(f'  printf("{name} %zu\\n", sizeof({name}));')
        ours += [name, str(ctypes.sizeof(struct))]
        for field, _ in struct._fields_:
            lines.append(f'  printf("{name}.{field} %zu\\n", offsetof({name}, {field}));')
            ours += [f"{name}.{field}", str(getattr(struct, field).offset)]
    lines += ["  return 0;", "}"]
    source = tmp_path / "layout.c"
    source.write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-o", str(tmp_path / "layout"), str(source)], check=True)
    printed = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True,
                             check=True).stdout.split()
    assert printed == ours
