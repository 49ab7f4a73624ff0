"""Graphs: the IR, tracing, passes and the executor."""
from .executor import Executor
from .ir import Graph, Node, Value
from .passes import eliminate_dead_code, fold_constants, infer_shapes, plan_memory, select_layouts
from .trace import trace

__all__ = ["Graph", "Node", "Value", "trace", "Executor", "infer_shapes", "eliminate_dead_code", "fold_constants",
           "select_layouts", "plan_memory"]
