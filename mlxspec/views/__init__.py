"""Rich renderables for the commands. Views are functions of state (events, stats); they do
no timing and never import MLX."""
