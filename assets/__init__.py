"""Thin Dagster assets: each unpacks config and resources, calls one ``model_code`` stage and
returns metadata. No ML logic lives here."""
