"""quickstart: the model, data loading and training, as the PyTorch template writes them."""

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from datasets import ClassLabel, Dataset, Features, Image
from flwr_datasets.partitioner import IidPartitioner
from torch.utils.data import DataLoader
from torchvision.transforms import Compose, Normalize, ToTensor


class Net(nn.Module):
    """A small CNN for 8x8 grey images."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = x.flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


partitioner = None  # cached, as the template caches its FederatedDataset

pytorch_transforms = Compose([ToTensor(), Normalize((0.5,), (0.5,))])


def load_data(partition_id: int, num_partitions: int, batch_size: int, rename: bool = False):
    """This partition's train and test DataLoaders of dict batches {"img", "label"}."""
    global partitioner
    if partitioner is None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = [(x * 16).clip(0, 255).astype(np.uint8) for x in digits.images]
        features = Features({"img": Image(), "label": ClassLabel(num_classes=10)})
        data = Dataset.from_dict({"img": images, "label": digits.target.tolist()}, features)
        partitioner = IidPartitioner(num_partitions=num_partitions)
        partitioner.dataset = data
    partition = partitioner.load_partition(partition_id)
    partition_train_test = partition.train_test_split(test_size=0.2, seed=42)
    img, label = ("pixels", "target") if rename else ("img", "label")

    def apply_transforms(batch):
        return {img: [pytorch_transforms(i) for i in batch["img"]], label: batch["label"]}

    partition_train_test = partition_train_test.with_transform(apply_transforms)
    trainloader = DataLoader(partition_train_test["train"], batch_size=batch_size, shuffle=True)
    testloader = DataLoader(partition_train_test["test"], batch_size=batch_size)
    return trainloader, testloader


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set; the mean training loss."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * max(1, len(trainloader)))


def test(net, testloader, device):
    """Validate the model on the test set; loss and accuracy."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    accuracy = correct / len(testloader.dataset)
    return loss / max(1, len(testloader)), accuracy
