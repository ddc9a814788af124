from django.db import models


class Order(models.Model):
    sku = models.CharField(max_length=64)
    quantity = models.PositiveIntegerField()
    status = models.CharField(max_length=16, default="new")
    task_id = models.CharField(max_length=128, blank=True)
