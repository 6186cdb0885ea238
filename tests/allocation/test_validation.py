import numpy as np
import pytest

from rlvr_core.allocation import PromptSource, make_allocator
from rlvr_core.errors import ConfigError
from rlvr_core.registry import UnknownNameError


def test_unknown_allocator_lists_valid_names():
    with pytest.raises(UnknownNameError) as e:
        make_allocator("sarah")
    msg = str(e.value)
    for name in ("grpo", "dapo", "sara", "vigor", "pods", "greso", "sara+dps"):
        assert name in msg
    assert "did you mean 'sara'" in msg


@pytest.mark.parametrize("name,kw,field", [
    ("grpo", {"k": 1}, "k"),
    ("sara", {"k": 1}, "k"),
    ("sara", {"tau_low": 1.0}, "tau_low"),
    ("sara", {"tau_low": -0.1}, "tau_low"),
    ("sara", {"mode": "rollouts", "budget": 7}, "budget"),
    ("sara", {"max_step_rollouts": 7}, "max_step_rollouts"),
    ("sara", {"probe_schedule": (0.0, 1.0)}, "probe_schedule"),
    ("sara", {"mode": "fixed"}, "mode"),
    ("sara", {"prior": "magic"}, "prior.kind"),
    ("vigor", {"alpha": 0.0}, "alpha"),
    ("vigor", {"alpha": 1.5}, "alpha"),
    ("vigor", {"gamma": 1.0}, "gamma"),
    ("vigor", {"budget": 3}, "budget"),
    ("dapo", {"max_gen_batches": 0}, "max_gen_batches"),
    ("pods", {"n_generate": 4}, "n_generate"),
    ("greso", {"p_explore": 0.0}, "p_explore"),
    ("grpo", {"batch_size": 0}, "batch_size"),
    ("pilot-commit", {"n_pilot": 8}, "n_pilot"),
    ("pilot-commit", {"lower": 0.9}, "lower"),
    ("pilot-commit", {"max_off_steps": -1}, "max_off_steps"),
    ("ar3po", {"stage_size": 0}, "stage_size"),
    ("ar3po", {"buffer_prompts": 0}, "buffer_prompts"),
    ("reinforce-ada", {"rule": "pos"}, "rule"),
    ("reinforce-ada", {"max_rounds": 0}, "max_rounds"),
])
def test_impossible_parameters_name_the_field(name, kw, field):
    with pytest.raises(ConfigError) as e:
        make_allocator(name, **kw)
    assert str(e.value).startswith(f"{name}.{field}")


@pytest.mark.parametrize("name,kw,message", [
    ("sara", {"tau_low": "0.5"}, "sara.tau_low: got '0.5'; need a number"),
    ("sara", {"max_step_rollouts": 64.0}, "sara.max_step_rollouts: got 64.0; need an int or null"),
    ("sara", {"mode": 1}, "sara.mode: got 1; need a string"),
    ("vigor", {"fill": "yes"}, "vigor.fill: got 'yes'; need true or false"),
    ("dapo", {"max_gen_batches": True}, "dapo.max_gen_batches: got True; need an int"),
    ("pilot-commit", {"exclude": "1"}, "pilot-commit.exclude: got '1'; need a number or null"),
    ("grpo", {"seed": 0.5}, "grpo.seed: got 0.5; need an int"),
])
def test_a_parameter_of_the_wrong_type_names_the_field_and_the_type(name, kw, message):
    """``tau_low: "0.5"`` raised "'<=' not supported between instances of 'float' and 'str'"."""
    with pytest.raises(ConfigError) as e:
        make_allocator(name, **kw)
    assert str(e.value) == message


def test_numpy_numbers_and_free_form_parameters_still_build():
    alloc = make_allocator("sara", k=np.int64(4), tau_low=np.float32(0.25), probe_schedule=[0.5, 1.0],
                           prior="uniform", max_step_rollouts=None)
    assert alloc.params.k == 4 and alloc.params.max_step_rollouts is None


def test_unknown_parameter_suggests_closest():
    with pytest.raises(ConfigError, match="did you mean 'tau_low'"):
        make_allocator("sara", tau_lo=0.3)


@pytest.mark.parametrize("name,bad,good", [("pilot-commit", "n_pilots", "n_pilot"),
                                           ("ar3po", "stage_sise", "stage_size"),
                                           ("reinforce-ada", "max_round", "max_rounds")])
def test_unknown_parameter_of_the_published_baselines_suggests_closest(name, bad, good):
    with pytest.raises(ConfigError, match=f"did you mean '{good}'"):
        make_allocator(name, **{bad: 1})


def test_a_misspelt_published_baseline_suggests_its_name():
    with pytest.raises(UnknownNameError, match="did you mean 'pilot-commit'"):
        make_allocator("pilot_commit")
    with pytest.raises(UnknownNameError, match="did you mean 'reinforce-ada'"):
        make_allocator("reinforce_ada")


@pytest.mark.parametrize("name", ["sara", "sara+dps"])
def test_the_old_name_of_the_step_cap_names_the_new_one(name):
    """SARA's per-step cap was called max_rollouts, like train.max_rollouts (the whole run's budget)."""
    with pytest.raises(ConfigError) as e:
        make_allocator(name, max_rollouts=512)
    assert str(e.value).startswith(f"{name}.max_rollouts: renamed max_step_rollouts")
    assert make_allocator(name, k=8, batch_size=4, max_step_rollouts=40).max_rollouts_per_step == 40


def test_empty_prompt_pool_is_refused():
    with pytest.raises(ConfigError, match="empty"):
        PromptSource([])
    with pytest.raises(ConfigError, match="duplicated"):
        PromptSource([1, 1, 2])
