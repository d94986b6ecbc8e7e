"""Floor 2: the learning rate: scaling rules and what they rest on, the recipe and its schedule,
the one lr function, ramp-ups and the gradient noise scale."""
