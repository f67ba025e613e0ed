"""scripts/check-layers on small trees: what it allows, what it refuses, and its table of
known exceptions. Usage: test_check_layers.py PATH_TO_CHECK_LAYERS"""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = None

TABLE = """\
    # Architecture

    ### The layer table

    | folder | may include |
    |---|---|
    | `base` | - |
    | `mid` | `base` |
    | `mid/sub` | `mid`, `base` |
    | `top` | `mid`, `base` |
    | `tests` | * |

    ### Known exceptions

    | from | to | why |
    |---|---|---|
    {exceptions}
    """


class CheckLayers(unittest.TestCase):
    def tree(self, files: dict, exceptions: str = "") -> str:
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root)
        docs = os.path.join(root, "docs")
        os.makedirs(docs)
        with open(os.path.join(docs, "architecture.md"), "w") as f:
            f.write(textwrap.dedent(TABLE).replace("{exceptions}", exceptions))
        for path, text in files.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        return root

    def run_check(self, root: str):
        return subprocess.run([sys.executable, SCRIPT, "--root", root], capture_output=True,
                              text=True)

    def test_includes_down_the_layers_pass(self):
        root = self.tree({
            "base/include/statepool/base/a.hpp": "#pragma once\n",
            "mid/m.cpp": '#include "statepool/base/a.hpp"\n#include "m.hpp"\n#include <vector>\n',
            "mid/m.hpp": "#pragma once\n",
            "mid/sub/s.cpp": '#include "m.hpp"\n',  # resolves to mid/m.hpp, one folder up
            "top/t.cpp": '#include "mid/m.hpp"\n#include "missing.hpp"\n',
            "tests/x.cpp": '#include "top/t.cpp"\n',
            "build/gen.cpp": '#include "top/t.cpp"\n',  # build folders are not read
        })
        r = self.run_check(root)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("follow the layers", r.stdout)

    def test_an_include_up_or_across_fails_and_names_the_site(self):
        root = self.tree({
            "base/b.hpp": '#include "mid/m.hpp"\n',
            "mid/m.hpp": "#pragma once\n",
            "top/t.hpp": "#pragma once\n",
            "mid/sub/s.cpp": '#include "top/t.hpp"\n',
        })
        r = self.run_check(root)
        self.assertEqual(r.returncode, 1)
        self.assertIn("base -> mid not allowed: base/b.hpp: mid/m.hpp", r.stderr)
        self.assertIn("mid/sub -> top not allowed: mid/sub/s.cpp: top/t.hpp", r.stderr)

    def test_a_known_exception_is_allowed_and_listed(self):
        files = {"base/b.hpp": '#include "mid/m.hpp"\n', "mid/m.hpp": "#pragma once\n"}
        root = self.tree(files, "| `base` | `mid` | to be moved |")
        r = self.run_check(root)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("known exception base -> mid: 1 include(s) (to be moved)", r.stdout)

    def test_an_unused_exception_fails(self):
        root = self.tree({"mid/m.hpp": "#pragma once\n"}, "| `base` | `mid` | to be moved |")
        r = self.run_check(root)
        self.assertEqual(r.returncode, 1)
        self.assertIn("known exception base -> mid is no longer used", r.stderr)

    def test_a_file_outside_every_folder_fails(self):
        root = self.tree({"stray/x.cpp": "int x;\n"})
        r = self.run_check(root)
        self.assertEqual(r.returncode, 1)
        self.assertIn("stray/x.cpp: in no folder of the layer table", r.stderr)

    def test_a_table_naming_an_unknown_folder_is_a_usage_error(self):
        root = self.tree({})
        path = os.path.join(root, "docs", "architecture.md")
        with open(path) as f:
            text = f.read().replace("| `mid` | `base` |", "| `mid` | `nowhere` |")
        with open(path, "w") as f:
            f.write(text)
        r = self.run_check(root)
        self.assertEqual(r.returncode, 2)
        self.assertIn("'nowhere', which has no row", r.stderr)


if __name__ == "__main__":
    SCRIPT = sys.argv.pop(1)
    unittest.main()
