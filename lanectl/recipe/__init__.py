"""Recipes: YAML files that describe serving lanes, loaded into validated, typed models."""
