"""Recipes: each driver loop fits on one screen and runs unchanged under any plan."""
