"""What a rank trains: the workload (the synthetic model, a registered factory, the token
model), its samplers, its gradients, and a mesh rank's share of the model.

Import rule: torch, `app.core` and `contract`. Never `measure`, `checks`, `rank` or
`service`, never the web stack.
"""
