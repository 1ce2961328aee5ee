"""`prompt-jax tasks` (tasks.inspect.main): listing and showing examples."""
from prompt_jax.tasks import inspect


def test_lists_tasks_with_splits_and_labels(capsys):
  assert inspect.main(["--filter", "rte_v102"]) == 0
  out = capsys.readouterr().out.splitlines()
  assert ("super_glue_rte_v102  splits=train,validation,test  labels=entailment|not_entailment"
          in out)
  assert ("taskless_super_glue_rte_v102_sentinel  splits=train,validation,test  "
          "labels=entailment|not_entailment" in out)
  assert all("rte_v102" in line for line in out)


def test_shows_preprocessed_examples(shared_data, capsys):
  root = shared_data("super_glue").parent
  assert inspect.main(["super_glue_copa_v102", "-n", "1", "--data_dir", str(root)]) == 0
  out = capsys.readouterr().out
  assert out.splitlines()[:3] == [
      "--- example 0",
      "inputs: copa choice1: The toilet filled with water. choice2: Water flowed from the spout. "
      "premise: The man turned on the faucet. question: effect",
      "targets: choice2",
  ]


def test_shows_tokens(shared_data, spm_path, capsys):
  root = shared_data("super_glue").parent
  argv = ["super_glue_cb_v102_sentinel", "-n", "1", "--data_dir", str(root), "--tokens",
          "--spm_path", str(spm_path)]
  assert inspect.main(argv) == 0
  assert "targets decoded: <extra_id_0> contradiction" in capsys.readouterr().out.splitlines()


def test_unknown_task_is_a_one_line_error(capsys):
  assert inspect.main(["super_glue_rte"]) == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith("prompt-jax tasks: error: unknown task or mixture 'super_glue_rte'")
  assert "\n" not in err
