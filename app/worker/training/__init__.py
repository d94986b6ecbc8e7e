"""What a rank trains: the workload (the synthetic model, a registered factory, the token
model), its samplers, its gradients, a mesh rank's share of the model, and the single-process
reference run of a plan's recipe that every multi-step comparison uses.

Import rule: torch, `app.core` and `contract`. Never `measure`, `checks`, `rank` or
`service`, never the web stack.
"""
