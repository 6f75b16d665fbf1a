"""Solvers shared by several learners (kept apart from the learners' models and data,
as skglm keeps its solvers apart from datafits and penalties)."""
