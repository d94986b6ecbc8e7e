"""The Python source the python skeleton is assembled from (it stays one self-contained file)."""
