"""The smallest end-to-end use of optcore: build from a config, train, checkpoint, resume."""

import io

import torch

import optcore

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
x, y = torch.randn(256, 16), torch.randn(256, 1)

config = {
    "optimizer": {"type": "AdamW", "lr": 3e-3, "weight_decay": 0.01},
    "lr_scheduler": {"type": "cosine", "warmup_steps": 10},
}
optimizer, scheduler = optcore.build(config, model, num_training_steps=100)
print(f"built {type(optimizer).__name__} with groups", [g.get("name") for g in optimizer.param_groups])

for step in range(100):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.backward(loss)
    norm = optimizer.clip_grad_norm(1.0)
    optimizer.step()
    scheduler.step()
    if step % 20 == 0:
        print(f"step {step:3d}  loss {loss.item():.4f}  grad-norm {norm.item():.3f}  lr {optimizer.get_lr():.2e}")

buf = io.BytesIO()
torch.save(optimizer.state_dict(), buf)
buf.seek(0)
optimizer.load_state_dict(torch.load(buf, weights_only=True), optimizer_overrides={"lr": 1e-4})
print("resumed with lr", optimizer.get_lr())
