import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_POST

from runifold_sync.contrib.django import enqueue_on_commit

from .models import Order


@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    with transaction.atomic():
        order = Order.objects.create(sku=body["sku"], quantity=int(body.get("quantity", 1)))
        # Enqueued when this transaction (or an outer one) commits; never if it rolls back.
        order.task_id = enqueue_on_commit("order-intake", 1, order.pk)
        order.save(update_fields=["task_id"])
    return JsonResponse({"order_id": order.pk, "task_id": order.task_id}, status=202)


@require_GET
def show_order(request: HttpRequest, order_id: int) -> JsonResponse:
    order = Order.objects.get(pk=order_id)
    return JsonResponse({"order_id": order.pk, "status": order.status, "task_id": order.task_id})
