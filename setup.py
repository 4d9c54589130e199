"""Only the C extensions live here; everything else is in pyproject.toml."""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"]

setup(
    ext_modules=[
        Extension(
            "dspark_proxy.shm._hostflag",
            sources=["dspark_proxy/shm/_hostflag.c"],
            extra_compile_args=_FLAGS,
        ),
        # the per-round hot paths beside their Python reference models (dspark_proxy/native.py)
        Extension(
            "dspark_proxy.round._fastround",
            sources=["dspark_proxy/round/_fastround.c", "dspark_proxy/round/_fastround_proxy.c",
                     "dspark_proxy/round/_fastround_accept.c", "dspark_proxy/round/_fastround_page.c",
                     "dspark_proxy/round/_fastround_inputs.c", "dspark_proxy/round/_fastround_held.c",
                     "dspark_proxy/round/_fastround_fused.c", "dspark_proxy/round/_fastround_stats.c",
                     "dspark_proxy/round/_fastround_entries.c", "dspark_proxy/round/_fastround_reply.c"],
            depends=["dspark_proxy/round/_fastround_shared.h"],
            extra_compile_args=_FLAGS,
        ),
        # the proxy's CPUs kept out of idle while rounds flow (proxy --keep-awake-ms)
        Extension(
            "dspark_proxy.ops._keepawake",
            sources=["dspark_proxy/ops/_keepawake.c"],
            extra_compile_args=_FLAGS,
        ),
        # the draft head's products; no contraction into FMA: the Python reference rounds each step
        Extension(
            "dspark_proxy.model._headmm",
            sources=["dspark_proxy/model/_headmm.c", "dspark_proxy/model/_headmm_mm.c",
                     "dspark_proxy/model/_headmm_fn.c", "dspark_proxy/model/_headmm_par.c",
                     "dspark_proxy/model/_headmm_step.c", "dspark_proxy/model/_headmm_bb.c",
                     "dspark_proxy/model/_headmm_proj.c", "dspark_proxy/model/_headmm_mm8.c",
                     "dspark_proxy/model/_headmm_fn8.c", "dspark_proxy/model/_headmm_py.c"],
            # each file but _headmm.c declares its exports in the header of its name (_headmm.c: which
            # file uses which); _headmm_common.h, of no file, holds what they all share
            depends=["dspark_proxy/model/_headmm_common.h", "dspark_proxy/model/_headmm_mm.h",
                     "dspark_proxy/model/_headmm_fn.h", "dspark_proxy/model/_headmm_par.h",
                     "dspark_proxy/model/_headmm_step.h", "dspark_proxy/model/_headmm_bb.h",
                     "dspark_proxy/model/_headmm_proj.h", "dspark_proxy/model/_headmm_mm8.h",
                     "dspark_proxy/model/_headmm_fn8.h", "dspark_proxy/model/_headmm_py.h"],
            extra_compile_args=[*_FLAGS, "-O3", "-ffp-contract=off", "-pthread"],
            extra_link_args=["-pthread"],
        ),
    ]
)
