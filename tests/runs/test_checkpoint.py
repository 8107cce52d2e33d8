import random

import numpy as np
import pytest
import torch

from slea.runs import checkpoint as ckpt


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.frozen = torch.nn.Linear(3, 2)
        self.frozen.requires_grad_(False)


def _step(net, opt):
    dev = net.a.weight.device
    loss = net.a(torch.randn(5, 4, device=dev)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_round_trip_weights_optimizer_rng(tmp_path, device):
    torch.manual_seed(0)
    net = Net().to(device)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-2)
    _step(net, opt)
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)  # seeds the CUDA generators too
    path = ckpt.save_checkpoint(tmp_path, 7, net, opt, extra={"episodes": 12})
    _step(net, opt)  # continue uninterrupted: the reference
    ref_w = net.a.weight.detach().clone()
    saved = set(ckpt._read_safetensors(path / "rng.safetensors"))
    assert saved == ({"torch"} if device == "cpu" and not torch.cuda.is_initialized() else
                     {"torch"} | {f"cuda.{i}" for i in range(torch.cuda.device_count())})

    def draws():
        return random.random(), float(np.random.rand()), float(torch.rand(1)), float(torch.rand(1, device=device))

    net2 = Net().to(device)
    opt2 = torch.optim.AdamW([p for p in net2.parameters() if p.requires_grad], lr=1e-2)
    state = ckpt.load_checkpoint(path, net2, opt2)
    assert state["iteration"] == 7 and state["episodes"] == 12
    first = draws()
    ckpt.load_checkpoint(path, net2, opt2)
    assert draws() == first  # every RNG restored (the device's generator too)
    assert opt2.state_dict()["state"][0]["exp_avg"].device.type == device  # moments back on the params' device
    # Restored weights, optimizer moments and RNG → the same next step as the uninterrupted run (bit for bit).
    net3 = Net().to(device)
    opt3 = torch.optim.AdamW([p for p in net3.parameters() if p.requires_grad], lr=1e-2)
    ckpt.load_checkpoint(path, net3, opt3)
    _step(net3, opt3)
    assert torch.equal(net3.a.weight, ref_w)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA restores the CUDA states")
def test_a_gpu_checkpoint_resumes_on_a_cpu_machine_with_its_cpu_stream(caplog):
    torch.manual_seed(11)
    tensors, meta = ckpt.rng_state()
    expected = float(torch.rand(1))
    tensors["cuda.0"] = torch.zeros(16, dtype=torch.uint8)  # what a GPU run adds
    ckpt.set_rng_state(tensors, meta)
    assert float(torch.rand(1)) == expected
    assert "RNG state of 1 CUDA device" in caplog.text


def test_only_trainable_saved_and_no_pickle(tmp_path):
    net = Net()
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad])
    path = ckpt.save_checkpoint(tmp_path, 0, net, opt)
    from safetensors.torch import load_file

    names = set(load_file(str(path / "trainable.safetensors")))
    assert names == {"a.weight", "a.bias"}
    assert sorted(p.suffix for p in path.iterdir()) == [".json", ".json", ".json", ".safetensors",
                                                          ".safetensors", ".safetensors"]  # + manifest.json


def test_keep_last_k_and_latest_ignores_partial(tmp_path):
    net = Net()
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad])
    for it in range(4):
        ckpt.save_checkpoint(tmp_path, it, net, opt, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["iter_000002", "iter_000003"]
    (tmp_path / ".tmp-iter_000004").mkdir()  # a writer killed mid-way
    (tmp_path / "iter_000005").mkdir()  # no state.json: not a checkpoint
    assert ckpt.latest_checkpoint(tmp_path).name == "iter_000003"


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    net = Net()
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad])
    path = ckpt.save_checkpoint(tmp_path, 0, net, opt)
    (path / "state.json").write_text("{not json")
    with pytest.raises(ValueError, match="unreadable"):
        ckpt.load_checkpoint(path, net)


def test_a_trainer_names_a_checkpoint_by_the_steps_it_holds(tmp_path):
    """``number``: the folder reads as the log lines count (iter_000006 after iteration 6 of them, whose index is 5);
    state.json keeps the index a resumed run continues from, and ``--checkpoint 6`` names that folder."""
    net = Net()
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad])
    path = ckpt.save_checkpoint(tmp_path / "checkpoints", 5, net, opt, number=6)
    assert path.name == "iter_000006"
    assert ckpt.load_checkpoint(path, Net(), restore_rng=False)["iteration"] == 5
    assert ckpt.run_checkpoint(tmp_path, "6") == path == ckpt.run_checkpoint(tmp_path, "iter_000006")
    assert ckpt.save_checkpoint(tmp_path / "old", 5, net, opt).name == "iter_000005"  # no number: as before
