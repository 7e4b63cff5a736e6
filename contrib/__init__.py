"""Sample output plugins written only against pgdecode's public API."""
