"""ONNX's light models: opforge against onnxruntime, in one process.

For each model of ``onnx/backend/test/data/light`` and ``resnet18_float16``
(or those --models names): load it with ``opforge.onnx.load`` (the time to load and run once is
printed: kernels not prebuilt compile into the cache on a first run), check
that opforge's output agrees with onnxruntime's on the same seeded random
input (rtol 1e-3, atol 1e-4; rtol 1e-2 for a float16 model), then time both after --warmup runs: the median
of --repeat runs, with

- opforge on one thread (``opforge.set_num_threads(1)``) against onnxruntime
  with ``intra_op_num_threads=1``;
- opforge with one thread per core against onnxruntime with all threads
  (``intra_op_num_threads=0``).

``resnet18_float16`` is no file: a ResNet-18 (batch 1, 3x224x224, batch
norms unfolded, seeded random weights) built here with ``onnx.helper``, every
tensor float16.  opforge computes its nodes in float32 between one cast at the
input and one at the output (``opforge.graph.float16``), as onnxruntime's CPU
provider does for the ops it has no float16 kernel for.

A ratio is opforge's median over onnxruntime's (below 1: opforge is faster).
The machine's load shows in the figures; compare ratios taken in one run.

    python benchmarks/onnx_models.py --models squeezenet,shufflenet,alexnet --repeat 20

--exported adds models exported from torch (random weights, dynamic dims
kept, so they load as DynamicModels: converted for the input's shapes on the
first run): a BERT-style encoder, a GPT-2-style decoder and a bidirectional
LSTM.

--breakdown adds, per model, the time per op type: opforge's nodes called
one at a time, and onnxruntime's own profile (which shows its fusions: a
Relu folded into Conv is gone from its list).

The last lines are ``onnx_models_geomean: <ratio 1 thread> <ratio all threads>``
and ``worst_model_vs_ort: <ratio> (<model>, <thread count>)``.

Each engine's runs follow each other (a serving loop), opforge's first.  Taking
turns run by run was tried; on this 2-core VM it measures the host instead:
a core left idle for 50 ms comes back slowly, and onnxruntime's idle threads
spin for more than 2 ms after a run, where opforge's sleep after 100 us.
squeezenet at all threads took opforge 5.7 ms in its own loop, 11.8 ms
2 ms after an onnxruntime run or 50 ms after its own.
"""
import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

try:
    import opforge
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    import opforge
import numpy as np
import onnx
import onnxruntime as ort

import opforge.onnx
from opforge.cli import _random_input, set_threads

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
BUILT = ["resnet18_float16"]  # models made by this script, not read from LIGHT
MODELS = sorted(p.name[len("light_"):-len(".onnx")] for p in LIGHT.glob("light_*.onnx")) + BUILT


def resnet18(dtype=np.float16, seed=0):
    """A ResNet-18 for 1x3x224x224 inputs (softmax over 1000 classes) as an ONNX model of ``dtype``
    tensors: Conv, BatchNormalization (not folded), Relu, MaxPool, Add, GlobalAveragePool, Flatten,
    Gemm, Softmax; He-scaled random weights and random batch-norm statistics."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes, weights = [], []

    def weight(name, array):
        weights.append(numpy_helper.from_array(array.astype(dtype), name))
        return name

    def conv_bn(x, name, c_in, c_out, k, stride, relu=True):
        w = weight(f"{name}_w", rng.standard_normal((c_out, c_in, k, k)) * np.sqrt(2 / (c_in * k * k)))
        nodes.append(helper.make_node("Conv", [x, w], [f"{name}_conv"], kernel_shape=[k, k], strides=[stride] * 2,
                                      pads=[k // 2] * 4))
        stats = [weight(f"{name}_{s}", v) for s, v in (
            ("scale", rng.uniform(0.5, 1.5, c_out)), ("bias", rng.uniform(-0.1, 0.1, c_out)),
            ("mean", rng.uniform(-0.1, 0.1, c_out)), ("var", rng.uniform(0.5, 1.5, c_out)))]
        nodes.append(helper.make_node("BatchNormalization", [f"{name}_conv", *stats], [f"{name}_bn"]))
        if not relu:
            return f"{name}_bn"
        nodes.append(helper.make_node("Relu", [f"{name}_bn"], [f"{name}_relu"]))
        return f"{name}_relu"

    x = conv_bn("x", "stem", 3, 64, 7, 2)
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))
    x, c_in = "pool", 64
    for stage, c_out in enumerate((64, 128, 256, 512)):
        for block in range(2):
            name, stride = f"s{stage}b{block}", 2 if stage and not block else 1
            y = conv_bn(conv_bn(x, f"{name}a", c_in, c_out, 3, stride), f"{name}b", c_out, c_out, 3, 1, relu=False)
            skip = x if stride == 1 and c_in == c_out else conv_bn(x, f"{name}d", c_in, c_out, 1, stride, relu=False)
            nodes.append(helper.make_node("Add", [y, skip], [f"{name}_sum"]))
            nodes.append(helper.make_node("Relu", [f"{name}_sum"], [f"{name}_out"]))
            x, c_in = f"{name}_out", c_out
    fc_w = weight("fc_w", rng.standard_normal((1000, 512)) / np.sqrt(512))
    fc_b = weight("fc_b", rng.uniform(-0.1, 0.1, 1000))
    nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"]), helper.make_node("Flatten", ["gap"], ["flat"]),
              helper.make_node("Gemm", ["flat", fc_w, fc_b], ["logits"], transB=1),
              helper.make_node("Softmax", ["logits"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "resnet18", [helper.make_tensor_value_info("x", elem, [1, 3, 224, 224])],
                              [helper.make_tensor_value_info("y", elem, [1, 1000])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def model_source(name):
    """What opforge and onnxruntime load for a model name: a file of LIGHT, or a built model's bytes."""
    if name == "resnet18_float16":
        return resnet18(np.float16).SerializeToString()
    return LIGHT / f"light_{name}.onnx"


def exported_models():
    """{name: (ONNX bytes, inputs)} of models exported by torch.onnx with dynamic dims kept: the BERT- and
    GPT-2-style models of tests/test_onnx_exported_models.py and a 2-layer bidirectional LSTM, each with
    random weights (needs torch)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_onnx_exported_models import TinyBert, TinyGPT, export

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 40, (4, 64)).astype(np.int64)
    bert = export(TinyBert(width=128, heads=4), (torch.from_numpy(ids), torch.ones(4, 64, dtype=torch.int64)),
                  ["ids", "mask"], {"ids": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}})
    gpt = export(TinyGPT(width=128, heads=4), (torch.from_numpy(ids),), ["ids"], {"ids": {0: "batch", 1: "seq"}})
    lstm = torch.nn.LSTM(64, 128, num_layers=2, bidirectional=True, batch_first=True)
    x = rng.standard_normal((4, 64, 64)).astype(np.float32)
    rnn = export(lstm, (torch.from_numpy(x),), ["x"], {"x": {0: "batch", 1: "seq"}})
    return {"bert_tiny": (bert, [ids, np.ones((4, 64), np.int64)]), "gpt_tiny": (gpt, [ids]), "lstm_bi2": (rnn, [x])}


def resolve(name):
    """A model's name, or the one model whose name ends with it (alexnet: bvlc_alexnet)."""
    matches = [m for m in MODELS if m.endswith("_" + name)]
    return matches[0] if name not in MODELS and len(matches) == 1 else name


def median_ms(fn, warmup, repeat):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def ort_session(path, threads):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), options,
                                providers=["CPUExecutionProvider"])


def bench_model(name, warmup, repeat, model=None, arrays=None):
    """One model's figures: a light model by name, or ``model`` (a path or bytes) run on ``arrays``."""
    path = model if model is not None else model_source(name)
    start = time.perf_counter()
    graph = opforge.onnx.load(path)
    loaded = time.perf_counter()
    rng = np.random.default_rng(0)
    arrays = arrays if arrays is not None else [_random_input(v.spec, rng) for v in graph.inputs]
    ours = graph(*arrays)
    first = time.perf_counter()
    ours = ours if isinstance(ours, tuple) else (ours,)

    sessions = {threads: ort_session(path, threads) for threads in (1, 0)}
    feed = {i.name: a for i, a in zip(sessions[1].get_inputs(), arrays)}
    theirs = sessions[1].run(None, feed)
    error = max(float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0 for a, b in zip(ours, theirs))
    agree = all(np.allclose(a.astype(np.float64), b, rtol=1e-2 if a.dtype == np.float16 else 1e-3, atol=1e-4)
                for a, b in zip(ours, theirs))
    if not agree and model is None and isinstance(path, Path):
        agree = softmax_agrees(path, arrays)

    set_threads(1)
    ours_1 = median_ms(lambda: graph(*arrays), warmup, repeat)
    ort_1 = median_ms(lambda: sessions[1].run(None, feed), warmup, repeat)
    set_threads(os.cpu_count() or 1)
    ours_all = median_ms(lambda: graph(*arrays), warmup, repeat)
    ort_all = median_ms(lambda: sessions[0].run(None, feed), warmup, repeat)
    return {"load_ms": 1e3 * (loaded - start), "first_ms": 1e3 * (first - loaded), "agree": agree, "error": error,
            "ours_1": ours_1, "ort_1": ort_1, "ours_all": ours_all, "ort_all": ort_all}


def softmax_agrees(path, arrays):
    """Whether a classifier agrees with onnxruntime by its logits (the final Softmax's input): the light
    models' constant weights give logits of 1e9 and more, whose softmax rounding decides (tests/helpers.py's
    assert_softmax_close says when the probabilities can be compared)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from helpers import assert_softmax_close, logits_exposed

    exposed = logits_exposed(onnx.load(str(path))).SerializeToString()
    ours = opforge.onnx.load(exposed)(*arrays)
    session = ort.InferenceSession(exposed, providers=["CPUExecutionProvider"])
    theirs = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), arrays)})
    if not isinstance(ours, tuple) or len(ours) != 2:
        return False
    try:
        assert_softmax_close(np.asarray(ours[0]), theirs[0], np.asarray(ours[1]), theirs[1], rtol=1e-3, atol=1e-4)
    except AssertionError:
        return False
    return True


def opforge_breakdown(graph, arrays, repeat):
    """{op name: ms per run}: each node called alone (the eager path), as Graph.replay does, timed."""
    from opforge.runtime.dispatch import launcher_for

    totals = {}
    for _ in range(repeat):
        env = {v.id: a for v, a in zip(graph.inputs, arrays)}
        for node in graph.nodes:
            if node.is_constant:
                env[node.outputs[0].id] = node.value
                continue
            launcher = launcher_for(node.op, node.attrs, len(node.inputs))
            args = [None if v is None else env[v.id] for v in node.inputs]
            start = time.perf_counter()
            result = launcher(*args)
            totals[node.op.name] = totals.get(node.op.name, 0.0) + time.perf_counter() - start
            for value, out in zip(node.outputs, result if node.op.tuple_output else (result,)):
                env[value.id] = out
    return {name: 1e3 * t / repeat for name, t in totals.items()}


def ort_breakdown(path, feed, repeat):
    """{ONNX op type: ms per run} from onnxruntime's profile, one thread."""
    import json
    import tempfile

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="opforge-ort-profile-"), "ort")
    session = ort.InferenceSession(path if isinstance(path, bytes) else str(path), options,
                                   providers=["CPUExecutionProvider"])
    for _ in range(repeat):
        session.run(None, feed)
    profile = session.end_profiling()
    with open(profile) as handle:
        events = json.load(handle)
    os.unlink(profile)
    totals = {}
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            op_type = event.get("args", {}).get("op_name", "?")
            totals[op_type] = totals.get(op_type, 0.0) + event["dur"] / 1e3
    return {name: t / repeat for name, t in totals.items()}


def print_breakdown(name, repeat):
    path = model_source(name)
    graph = opforge.onnx.load(path)
    rng = np.random.default_rng(0)
    arrays = [_random_input(v.spec, rng) for v in graph.inputs]
    graph(*arrays)
    set_threads(1)
    ours = sorted(opforge_breakdown(graph, arrays, repeat).items(), key=lambda item: -item[1])
    session = ort_session(path, 1)
    theirs = sorted(ort_breakdown(path, {i.name: a for i, a in zip(session.get_inputs(), arrays)}, repeat).items(),
                    key=lambda item: -item[1])
    print(f"  {name}, one thread, ms per run by op (opforge: each node called alone | onnxruntime's profile):")
    for k in range(max(len(ours), len(theirs))):
        left = f"{ours[k][0]:<22}{ours[k][1]:>8.2f}" if k < len(ours) else " " * 30
        right = f"{theirs[k][0]:<22}{theirs[k][1]:>8.2f}" if k < len(theirs) else ""
        print(f"    {left}  |  {right}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated model names (default all: {','.join(MODELS)})")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per measurement (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before each measurement (default 3)")
    parser.add_argument("--exported", default="bert_tiny,gpt_tiny,lstm_bi2",
                        help="models exported from torch with dynamic dims to run too (default: all three; "
                             "'' for none): bert_tiny, gpt_tiny (2 layers, width 128, batch 4 x 64 tokens), "
                             "lstm_bi2 (2 bidirectional layers of 128, 4 x 64 steps)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also print, per model, the time per op type of opforge and of onnxruntime")
    args = parser.parse_args(argv)
    names = [resolve(n.strip().removeprefix("light_")) for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")

    print(f"{os.cpu_count()} CPU(s); onnxruntime {ort.__version__}; median of {args.repeat} runs after "
          f"{args.warmup} warm-up; ratio = opforge / onnxruntime")
    print(f"{'model':<16}{'load+1st ms':>12}{'agree':>7}{'opforge 1t':>12}{'ort 1t':>10}{'ratio':>7}"
          f"{'opforge all':>13}{'ort all':>10}{'ratio':>7}")
    ratios_1, ratios_all = [], []
    worst = (0.0, "", "")
    exported = [n.strip() for n in args.exported.split(",") if n.strip()]
    built = exported_models() if exported else {}
    if set(exported) - set(built):
        parser.error(f"unknown exported model(s) {sorted(set(exported) - set(built))}; known: {', '.join(built)}")
    for name in names + exported:
        try:
            r = bench_model(name, args.warmup, args.repeat, *built.get(name, (None, None)))
        except opforge.OpforgeError as error:
            print(f"{name:<16}failed: {str(error).splitlines()[0]}")
            continue
        ratios_1.append(r["ours_1"] / r["ort_1"])
        ratios_all.append(r["ours_all"] / r["ort_all"])
        worst = max(worst, (ratios_1[-1], name, "1 thread"), (ratios_all[-1], name, "all threads"))
        print(f"{name:<16}{r['load_ms'] + r['first_ms']:>12.0f}{'yes' if r['agree'] else 'NO':>7}"
              f"{r['ours_1']:>12.2f}{r['ort_1']:>10.2f}{ratios_1[-1]:>7.2f}"
              f"{r['ours_all']:>13.2f}{r['ort_all']:>10.2f}{ratios_all[-1]:>7.2f}"
              + ("" if r["agree"] else f"  (max abs difference {r['error']:.3g})"))
        if args.breakdown and name in MODELS:
            print_breakdown(name, args.repeat)
    if not ratios_1:
        return 1
    geomean = [math.exp(statistics.fmean(math.log(r) for r in rs)) for rs in (ratios_1, ratios_all)]
    print(f"onnx_models_geomean: {geomean[0]:.2f} {geomean[1]:.2f}")
    print(f"worst_model_vs_ort: {worst[0]:.2f} ({worst[1]}, {worst[2]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
