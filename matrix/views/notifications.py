"""Notifications: a person's subscriptions (topics, a channel, a scope),
a "send test" for each, and the log of every delivery attempt."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from matrix.accounts.roles import ADMIN, has_role
from matrix.models import DeviceType, Operator, ServedCall
from matrix.models.notifications import (
    SUBSCRIBABLE,
    Channel,
    DeliveryAttempt,
    Subscription,
)
from matrix.notifications.services import test_send

ATTEMPTS_SHOWN = 100


class SubscriptionForm(forms.ModelForm):
    topics = forms.MultipleChoiceField(
        choices=[(t.value, t.label) for t in SUBSCRIBABLE],
        widget=forms.CheckboxSelectMultiple,
    )
    model = forms.ChoiceField(required=False, label="Served model")
    url = forms.URLField(
        required=False, max_length=500, assume_scheme="https", label="Webhook URL"
    )

    class Meta:
        model = Subscription
        fields = [
            "topics",
            "channel",
            "email",
            "url",
            "backend",
            "device_type",
            "operator",
            "model",
        ]
        labels = {"url": "Webhook URL", "email": "Email address"}

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        self.fields["email"].initial = user.email
        self.fields["device_type"].queryset = DeviceType.objects.all()
        self.fields["operator"].queryset = Operator.objects.all()
        sources = ServedCall.objects.values_list("source", flat=True).distinct()
        self.fields["model"].choices = [("", "any")] + [
            (s, s) for s in sorted(set(sources))
        ]

    def clean(self):
        data = super().clean()
        channel = data.get("channel")
        if channel == Channel.EMAIL and not data.get("email"):
            self.add_error("email", "email needs an address")
        if channel == Channel.WEBHOOK:
            if not data.get("url"):
                self.add_error("url", "a webhook needs its URL")
            data["email"] = ""
        else:
            data["url"] = ""
        return data

    def save(self, commit=True):
        self.instance.user = self.user
        return super().save(commit)


def _subscription_for_user(user, pk: int) -> Subscription:
    """A subscription is its owner's (and an admin's) to test or remove."""
    subscription = get_object_or_404(Subscription, pk=pk)
    if subscription.user_id != user.pk and not has_role(user, ADMIN):
        raise PermissionDenied("this subscription is someone else's")
    return subscription


@login_required
@require_http_methods(["GET", "POST"])
def notifications_page(request):
    form = SubscriptionForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, "Subscribed.")
        return redirect("notifications")
    everyone = has_role(request.user, ADMIN)
    subscriptions = Subscription.objects.filter(active=True).select_related(
        "device_type", "operator", "user"
    )
    attempts = DeliveryAttempt.objects.select_related(
        "delivery__notification", "delivery__subscription__user"
    )
    if not everyone:
        subscriptions = subscriptions.filter(user=request.user)
        attempts = attempts.filter(delivery__subscription__user=request.user)
    return render(
        request,
        "notifications/page.html",
        {
            "form": form,
            "subscriptions": subscriptions,
            "attempts": attempts[:ATTEMPTS_SHOWN],
            "everyone": everyone,
        },
        status=400 if form.errors else 200,
    )


@login_required
@require_POST
def subscription_test(request, pk: int):
    subscription = _subscription_for_user(request.user, pk)
    test_send(subscription=subscription, by=request.user)
    messages.success(
        request,
        f"Test message queued for {subscription.address}; its attempt shows "
        "below once sent.",
    )
    return redirect("notifications")


@login_required
@require_POST
def subscription_stop(request, pk: int):
    """Stop a subscription. Its row stays, so the delivery log keeps saying
    where each attempt went."""
    subscription = _subscription_for_user(request.user, pk)
    Subscription.objects.filter(pk=subscription.pk).update(active=False)
    messages.success(request, f"Stopped: nothing more goes to {subscription.address}.")
    return redirect("notifications")
