"""A built-in model name finds the folder `make demo-model` prepared, whatever data dir the server runs with, and
a refusal names every folder it looked in and the command that prepares one there."""

import json

import pytest

from app.engine.models.aliases import MARKER_NAME, PROJECT_DATA_DIR, ModelNotPrepared, resolve_alias

ALIAS = "qwen2.5-0.5b-demo"


def prepare(data_dir):
    folder = data_dir / "models" / ALIAS
    folder.mkdir(parents=True)
    (folder / MARKER_NAME).write_text(json.dumps({"sha256": "0" * 64}))
    return str(folder)


def test_a_model_prepared_under_the_projects_data_dir_is_found_from_another(tmp_path):
    project, server = tmp_path / "var", tmp_path / "elsewhere"
    prepared = prepare(project)
    assert resolve_alias(ALIAS, server, also=(project,)) == prepared
    mine = prepare(server)  # the server's own data dir comes first
    assert resolve_alias(ALIAS, server, also=(project,)) == mine
    assert resolve_alias("Qwen/Qwen2.5-0.5B-Instruct", server) == "Qwen/Qwen2.5-0.5B-Instruct"  # no alias: as given


def test_an_unprepared_model_is_refused_naming_where_it_looked_and_what_to_run(tmp_path):
    project, server = tmp_path / "var", tmp_path / "elsewhere"
    (project / "models" / ALIAS).mkdir(parents=True)  # a conversion that never finished: no marker
    with pytest.raises(ModelNotPrepared) as refused:
        resolve_alias(ALIAS, server, also=(project,))
    assert str(refused.value) == (
        f"model '{ALIAS}' is not prepared: neither {server}/models/{ALIAS} nor {project}/models/{ALIAS} has "
        f"{MARKER_NAME}. Prepare it with `.venv/bin/python -m app.engine.models.fetch {ALIAS} --data-dir {server}` "
        f"(`make demo-model` prepares it under {PROJECT_DATA_DIR}), then start again")
    with pytest.raises(ModelNotPrepared, match=f"^model '{ALIAS}' is not prepared: {project}/models/{ALIAS} has no "):
        resolve_alias(ALIAS, project, also=(project,))
