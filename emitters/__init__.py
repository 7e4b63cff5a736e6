"""pgdecode's built-in emitters, each an output plugin of the framework."""
