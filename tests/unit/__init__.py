"""Parts alone, on hand-made values: the rule, sampling, the tree's rule, the cost model and
controller, text, the history index, the package's layout."""
