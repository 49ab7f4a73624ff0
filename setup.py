"""Builds opforge's one C++ extension, opforge._native (the kernel-call fast path), then
compiles every built-in kernel into opforge/_prebuilt (see opforge.runtime.prebuilt), so
that no compiler runs at their first use.  OPFORGE_PREBUILD=0 skips the second step."""
import os
import shutil
import subprocess
import sys

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

native = Extension(
    "opforge._native",
    sources=[
        "src/opforge/csrc/native.cc",
        "src/opforge/csrc/buffers.cc",
        "src/opforge/csrc/dlpack.cc",
        "src/opforge/csrc/device_memory.cc",
        "src/opforge/csrc/device_call.cc",
        "src/opforge/csrc/parallel.cc",
        "src/opforge/csrc/extra_abi0.cc",
        "src/opforge/csrc/extra_abi1.cc",
    ],
    include_dirs=[numpy.get_include()],
    # 1.22: arrays carry their memory handler (buffers.cc gives outputs one)
    define_macros=[("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION")],
    extra_compile_args=["-std=c++17", "-O2", "-fvisibility=hidden"],
    language="c++",
)

# Flags a user may set for their own kernels; the prebuilt set is made without them
# (a run with them set builds the built-ins it uses, as their keys then differ).
USER_BUILD_VARIABLES = ("OPFORGE_CFLAGS", "OPFORGE_CXXFLAGS", "OPFORGE_INCLUDE_DIRS", "OPFORGE_PREBUILT")


class build_ext_and_prebuilt(build_ext):
    """build_ext, then the built-in kernels compiled next to the package (in place
    for ``--inplace`` and editable installs, else into the build folder the wheel is made of)."""

    def copy_file(self, infile, outfile, *args, **kwargs):
        """--inplace copies the extension into src/opforge: through a new file moved into
        place, as processes running from the checkout may have the old one mapped (writing
        over it in place can crash them)."""
        if not self.inplace or os.path.isdir(outfile):
            return super().copy_file(infile, outfile, *args, **kwargs)
        temporary = f"{outfile}.tmp-{os.getpid()}"
        shutil.copyfile(infile, temporary)
        shutil.copymode(infile, temporary)
        os.replace(temporary, outfile)
        return outfile, 1

    def run(self):
        super().run()
        if os.environ.get("OPFORGE_PREBUILD", "").strip().lower() in ("0", "false", "no", "off"):
            print("opforge: OPFORGE_PREBUILD=0: built-in kernels will compile at first use", file=sys.stderr)
            return
        if self.inplace:
            package = self.get_finalized_command("build_py").get_package_dir("opforge")
            root = os.path.dirname(os.path.abspath(package))
        else:
            root = os.path.abspath(self.build_lib)
        env = {k: v for k, v in os.environ.items() if k not in USER_BUILD_VARIABLES}
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        folder = os.path.join(root, "opforge", "_prebuilt")
        script = ("import sys, opforge.runtime.prebuilt as p; "
                  "sys.exit(p.main(sys.argv[1:]))")
        # A child interpreter: it imports opforge from the folder just built, with no user ops.
        done = subprocess.run([sys.executable, "-c", script, folder], env=env, cwd=root)
        if done.returncode != 0:
            # The package works without (part of) the set: those kernels compile at first use.
            print(f"opforge: warning: prebuilding the built-in kernels failed (status {done.returncode}); "
                  "see the messages above", file=sys.stderr)


setup(ext_modules=[native], cmdclass={"build_ext": build_ext_and_prebuilt})
