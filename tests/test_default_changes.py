"""A changed default never pools runs of two configs (canonical_network.records.DefaultChange): runs are placed
by the value they ran with, not by their command line."""

from __future__ import annotations

from canonical_network.records import DEFAULT_CHANGES, DefaultChange, variant_of

CHANGE = DefaultChange(experiments=("nbody/cn_gnn",), key="canonicalization.features", old="pvq", new="p",
                       why="test")


def _run(features, *overrides, experiment="nbody/cn_gnn"):
    return {"experiment": experiment, "config.canonicalization.features": features,
            "overrides": [f"experiment={experiment}", "seed=0", "trainer.max_epochs=1000", *overrides]}


def test_runs_are_placed_by_the_value_they_ran_with():
    changes = (CHANGE,)
    old_default = _run("pvq")  # no override, ran with the old default: now a variant
    assert variant_of(old_default, changes) == ("canonicalization.features=pvq",)
    ablation = _run("p", "canonicalization.features=p")  # the ablation that set the new value: now the row
    assert variant_of(ablation, changes) == ()
    new_default = _run("p")  # after the change
    assert variant_of(new_default, changes) == ()
    back = _run("pvq", "canonicalization.features=pvq")  # after the change, the old value asked for
    assert variant_of(back, changes) == variant_of(old_default, changes)
    other = _run("pv", "canonicalization.features=pv")  # a third value stays its own variant
    assert variant_of(other, changes) == ("canonicalization.features=pv",)
    mixed = _run("p", "canonicalization.features=p", "canonicalization.hidden_dim=16")
    assert variant_of(mixed, changes) == ("canonicalization.hidden_dim=16",)


def test_other_experiments_and_records_without_the_key_are_untouched():
    changes = (CHANGE,)
    assert variant_of(_run("pvq", experiment="nbody/cn_mlp_e3"), changes) == ()
    old_record = {"experiment": "nbody/cn_gnn", "overrides": ["experiment=nbody/cn_gnn"],
                  "config.canonicalization.translation": "learned"}  # its section, without the key: predates it
    assert variant_of(old_record, changes) == ()
    # unless the key was introduced keeping the old behaviour: then such a record ran with the old value
    kept = (DefaultChange(**{**CHANGE.__dict__, "absent_means_old": True}),)
    assert variant_of(old_record, kept) == ("canonicalization.features=pvq",)
    bare = {"experiment": "nbody/cn_gnn", "overrides": []}  # no config recorded at all: nothing to read
    assert variant_of(bare, kept) == ()


def test_every_registered_change_names_its_evidence():
    for change in DEFAULT_CHANGES:
        assert change.experiments and change.old != change.new and len(change.why) > 20


def test_how_a_run_executes_is_not_a_variant():
    """Compiling (the protocol rows of Table 3 train compiled) or a matmul precision runs the same model: such a
    run is its row, while an override of the model stays a variant beside them."""
    compiled = _run("pvq", "callbacks.early_stopping=null", "compile=true", "matmul_precision=high")
    assert variant_of(compiled, ()) == ()
    assert variant_of(_run("pvq", "compile=true", "canonicalization.hidden_dim=16"), ()) == (
        "canonicalization.hidden_dim=16",)
