"""A streaming dataset (IterableDataset) split over data-parallel ranks and DataLoader workers, as
`datasets`, WebDataset and a rank x worker reader split it: the plan, its counts, its sample ids."""
