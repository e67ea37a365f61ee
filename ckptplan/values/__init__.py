"""The values that cross stages: the plan and its predictions, the profile's data, the phases
and peaks of a step, pipelines, budgets and unit names. Plain data, importable without torch,
so the runtime, the torch-free solvers' callers and every stage read them alike."""
