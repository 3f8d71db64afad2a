"""What the user asks for: the tree table, key tables, recipe, project, targets, data and task."""
