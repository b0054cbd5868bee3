"""Your own models: every module in this folder is imported before a model is looked up, so a
function decorated with ``@register_model("<name>")`` here becomes ``model=<name>`` (with a
``conf/model/<name>.yaml``), in ``driftfl run`` and on every node alike, since this folder
travels in the Flower app bundle. See docs/adding-a-model.md."""
