"""Example check models to register and to copy from: factories that return
`(model, dataset, loss_fn)`, named as `app.worker.example_models:mlp` (the top-level
re-exports) or `app.worker.zoo.example_models:mlp`.

Import rule: torch (and transformers, inside a factory). Nothing in the app imports the zoo:
a worker reaches a model only through a registry string (`contract.targets.resolve`).
"""
